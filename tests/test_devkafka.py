"""The development broker's helpers (the broker itself runs in tests/test_kafka_source.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sessionlake import devkafka


def test_a_cluster_id_never_starts_like_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(devkafka.uuid, "uuid4", lambda: next(drawn))

    assert devkafka.new_cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"


def test_a_cluster_id_is_a_uuid_in_urlsafe_base64() -> None:
    ids = {devkafka.new_cluster_id() for _ in range(1_000)}

    assert len(ids) == 1_000
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_the_run_to_try_names_a_lake_an_earlier_broker_filled(tmp_path: Path) -> None:
    """Each start of the development broker is a new cluster, which a lake that read an
    earlier one refuses: the hint says so rather than give a command that fails."""
    lake = tmp_path / "kafka-lake"
    fresh = devkafka.try_hint("127.0.0.1:9092", "clicks", lake)
    assert fresh == ("Try:\n  sessionlake run --source kafka --kafka-bootstrap 127.0.0.1:9092 "
                     f"--topic clicks --lake {lake}")
    lake.mkdir()
    assert devkafka.try_hint("127.0.0.1:9092", "clicks", lake) == (
        f"{fresh}\nafter `rm -rf {lake}`: it holds what an earlier start of this broker gave, "
        "and each start is a new Kafka cluster, which its checkpoint refuses (or give another "
        "--lake)")
