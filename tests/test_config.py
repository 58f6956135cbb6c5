"""Settings: one parse and validation for flags, DAG params and the environment."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from sessionlake.config import (
    ConfigError,
    check_process_environment,
    format_age,
    format_duration,
    parse_duration,
    settings_from,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30m", 1800), ("90s", 90), ("24h", 86400), ("1d", 86400), ("1.5h", 5400), ("250ms", 0.25),
     (45, 45), ("45", 45)],
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text, "gap") == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["soon", "-5m", "5 minutes", ""])
def test_bad_durations_name_the_setting(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^grace"):
        parse_duration(text, "grace")


@pytest.mark.parametrize(("since", "said"), [
    (timedelta(seconds=115.99), "116s"),  # the stalled stream's "115.99s ago"
    (timedelta(seconds=0.4), "0s"),
    (timedelta(minutes=42, seconds=10), "42m"),
    (timedelta(hours=3, seconds=20), "3h"),
    (timedelta(minutes=125, seconds=40), "126m"),
])
def test_an_age_is_said_in_whole_seconds_then_whole_minutes(since: timedelta, said: str) -> None:
    assert format_age(since) == said


def test_format_duration_round_trips() -> None:
    for value in ("30m", "5m", "90s", "1d", "1.5h"):
        parsed = parse_duration(value, "x")
        assert parse_duration(format_duration(parsed), "x") == parsed
    assert format_duration(parse_duration("24h", "x")) == "1d"


def test_flags_win_over_environment_over_defaults(tmp_path: Path) -> None:
    env = {"SESSIONLAKE_LAKE": str(tmp_path / "env-lake"), "SESSIONLAKE_GAP": "10m"}
    from_env = settings_from({}, env=env)
    assert (from_env.lake, from_env.gap, from_env.grace) == (
        str(tmp_path / "env-lake"), timedelta(minutes=10), timedelta(minutes=5))
    flagged = settings_from({"gap": "20m"}, env=env)
    assert flagged.gap == timedelta(minutes=20)
    # Overrides keep what the base had, whatever the environment says.
    assert flagged.with_overrides(user_buckets=8).gap == timedelta(minutes=20)


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("SESSIONLAKE_GAP", "abc", "gap must be a duration .*, got 'abc' \\(from SESSIONLAKE_GAP\\)$"),
    ("SESSIONLAKE_KAFKA_MAX_OFFSETS_PER_TRIGGER", "0",
     "max-offsets-per-trigger must be .* \\(from SESSIONLAKE_KAFKA_MAX_OFFSETS_PER_TRIGGER\\)$"),
    ("SESSIONLAKE_KAFKA_STARTING_OFFSETS", "middle",
     "\\(from SESSIONLAKE_KAFKA_STARTING_OFFSETS\\)$"),
    ("SESSIONLAKE_KAFKA_REREAD_WAIT", "soon",
     "kafka-reread-wait must be a duration .*, got 'soon' "
     "\\(from SESSIONLAKE_KAFKA_REREAD_WAIT\\)$"),
])
def test_a_bad_value_from_the_environment_names_its_variable(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from({"lake": "L"}, env={variable: value})
    # The same value from a flag names the flag alone.
    key = variable.removeprefix("SESSIONLAKE_").lower()
    with pytest.raises(ConfigError) as flagged:
        settings_from({"lake": "L", key: value}, env={})
    assert "(from " not in str(flagged.value)


def test_relative_paths_become_absolute_and_uris_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert settings_from({"lake": "lake"}, env={}).lake == str(tmp_path / "lake")
    assert settings_from({"lake": "s3a://bucket/lake"}, env={}).lake == "s3a://bucket/lake"
    checkpoint = settings_from({"lake": "L"}, env={}).checkpoint
    assert checkpoint == str(tmp_path / "L" / "_checkpoints" / "stream")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "no lake location"),
        ({"lake": "L", "gap": "0s"}, "gap must be longer than 0"),
        ({"lake": "L", "gap": "2h", "max_session_duration": "1h"},
         "max-session-duration must be at least the gap"),
        ({"lake": "L", "input_format": "csv"}, "format must be one of jsonl, apache"),
        ({"lake": "L", "trigger": "sometimes"}, "trigger must be one of"),
        ({"lake": "L", "user_buckets": "many"}, "user-buckets must be a whole number"),
        ({"lake": "L", "kafka_bootstrap": "broker"}, "kafka-bootstrap must be HOST:PORT"),
        ({"lake": "L", "kafka_bootstrap": "a:9092,b:99999"}, "'b:99999' is not a host"),
        ({"lake": "L", "kafka_topic": "clicks/eu"}, "topic must be a Kafka topic name"),
        ({"lake": "L", "kafka_starting_offsets": "newest"},
         "starting-offsets must be one of earliest, latest"),
        ({"lake": "L", "kafka_max_offsets_per_trigger": "0"},
         "max-offsets-per-trigger must be a whole number"),
        ({"lake": "L", "kafka_reread_wait": "0s"}, "kafka-reread-wait must be longer than 0"),
    ],
)
def test_bad_settings_are_refused_with_their_name(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from(values, env={})


def test_kafka_settings_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"SESSIONLAKE_LAKE": "L", "SESSIONLAKE_SOURCE": "kafka",
           "SESSIONLAKE_KAFKA_BOOTSTRAP": "k1:9092, [::1]:9093",
           "SESSIONLAKE_KAFKA_TOPIC": "clicks", "SESSIONLAKE_KAFKA_STARTING_OFFSETS": "latest",
           "SESSIONLAKE_KAFKA_MAX_OFFSETS_PER_TRIGGER": "500",
           "SESSIONLAKE_KAFKA_REREAD_WAIT": "30s"}
    settings = settings_from({}, env=env)
    # `kafka` names the source, not a folder; `./kafka` is still a folder.
    assert settings.source == "kafka" and settings.reads_kafka
    assert (settings.kafka_bootstrap, settings.kafka_topic, settings.kafka_starting_offsets,
            settings.kafka_max_offsets_per_trigger) == ("k1:9092,[::1]:9093", "clicks",
                                                         "latest", 500)
    assert settings.kafka_reread_wait == timedelta(seconds=30)
    folder = settings_from({"source": "./kafka"}, env=env)
    assert folder.source == str(tmp_path / "kafka") and not folder.reads_kafka
    assert settings_from({"lake": "L"}, env={}).kafka_starting_offsets == "earliest"


def test_kafka_properties_are_read_from_their_file(tmp_path: Path) -> None:
    """A secured cluster's client settings, in Kafka's own properties format (comments,
    ``:`` separators and a value continued on the next line included)."""
    file = tmp_path / "client.properties"
    file.write_text("# SASL over TLS\n"
                    "security.protocol=SASL_SSL\n"
                    "sasl.mechanism: PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n"
                    '    required username="u" password="p=q";\n')
    settings = settings_from({"lake": "L", "kafka_properties": str(file)}, env={})
    assert settings.kafka_properties == str(file)
    assert settings.kafka_client_properties() == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
                            'required username="u" password="p=q";'}
    assert settings_from({"lake": "L"}, env={}).kafka_client_properties() == {}


@pytest.mark.parametrize(("text", "message"), [
    ("bootstrap.servers=h:9092\n", "sets bootstrap.servers, .* --kafka-bootstrap sets"),
    ("auto.offset.reset=latest\n", "--starting-offsets says where"),
    ("kafka.security.protocol=SSL\n", "write Kafka's own name, security.protocol"),
    ("key=\\uZZZZ\n", "cannot read"),
    (None, "cannot read .*No such file"),
])
def test_bad_kafka_properties_are_refused_naming_the_key(
    text: str | None, message: str, tmp_path: Path
) -> None:
    file = tmp_path / "client.properties"
    if text is not None:
        file.write_text(text)
    with pytest.raises(ConfigError, match=f"kafka-properties: .*{message}"):
        settings_from({"lake": "L", "kafka_properties": str(file)}, env={})
    with pytest.raises(ConfigError, match="from SESSIONLAKE_KAFKA_PROPERTIES"):
        settings_from({"lake": "L"}, env={"SESSIONLAKE_KAFKA_PROPERTIES": str(file)})


@pytest.mark.parametrize(("variable", "value", "wrong"), [
    ("SESSIONLAKE_CONFLICT_ATTEMPTS", "1", False),
    ("SESSIONLAKE_CONFLICT_ATTEMPTS", "0", True),
    ("SESSIONLAKE_CONFLICT_ATTEMPTS", "-3", True),
    ("SESSIONLAKE_CONFLICT_ATTEMPTS", "2.5", True),
])
def test_the_process_variables_are_checked_together(
    variable: str, value: str, wrong: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What each command checks at its start, naming the variable."""
    monkeypatch.setenv(variable, value)
    if wrong:
        with pytest.raises(ConfigError, match=variable):
            check_process_environment()
    else:
        check_process_environment()
