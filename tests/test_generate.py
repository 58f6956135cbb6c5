"""The synthetic clickstream: deterministic, clean when asked, dirty in the amounts asked."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path

import pytest

from sessionlake.generate import generate_clickstream


def records(files: list[Path]) -> list[list[str]]:
    return [f.read_text().splitlines() for f in files]


def is_valid(line: str) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return (
        isinstance(record, dict)
        and isinstance(record.get("user_id"), str) and record["user_id"].strip() != ""
        and isinstance(record.get("event_time"), str)
        and isinstance(record.get("properties", {}), dict)
        and _time(record["event_time"]) is not None
    )


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _must_time(text: str) -> datetime:
    """The time of a record the generator wrote valid."""
    moment = _time(text)
    assert moment is not None, text
    return moment


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = generate_clickstream(tmp_path / "a", users=20, events=300, files=3, seed=5,
                             late_fraction=0.1, duplicate_fraction=0.1, malformed_fraction=0.1)
    b = generate_clickstream(tmp_path / "b", users=20, events=300, files=3, seed=5,
                             late_fraction=0.1, duplicate_fraction=0.1, malformed_fraction=0.1)
    c = generate_clickstream(tmp_path / "c", users=20, events=300, files=3, seed=6)
    assert records(a.files) == records(b.files) != records(c.files)


def test_clean_stream_is_chronological_unique_and_valid(tmp_path: Path) -> None:
    result = generate_clickstream(tmp_path, users=50, events=2000, files=5, seed=1)
    previous_max = None
    ids: set[str] = set()
    for lines in records(result.files):
        assert all(is_valid(line) for line in lines)
        parsed = [json.loads(line) for line in lines]
        times = [_must_time(p["event_time"]) for p in parsed]
        if previous_max is not None:
            assert min(times) >= previous_max
        previous_max = max(times)
        ids.update(p["event_id"] for p in parsed)
    assert len(ids) == result.events == 2000
    # Files land oldest first, in name order, as the file source will take them.
    mtimes = [f.stat().st_mtime for f in result.files]
    assert mtimes == sorted(mtimes)


def test_dirty_stream_has_the_announced_counts(tmp_path: Path) -> None:
    result = generate_clickstream(tmp_path, users=50, events=2000, files=4, seed=2,
                                  late_fraction=0.05, duplicate_fraction=0.02,
                                  malformed_fraction=0.03)
    lines = [line for file in records(result.files) for line in file]
    valid = [json.loads(line) for line in lines if is_valid(line)]
    assert len(lines) - len(valid) == result.malformed == 60
    assert len(valid) - len({v["event_id"] for v in valid}) == result.duplicates == 40
    assert result.late > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"users": 0}, "users must be a whole number >= 1"),
        ({"events": 0}, "events must be"),
        ({"files": 0}, "files must be"),
        ({"late_fraction": 1.5}, "late-fraction must be in [0, 1)"),
    ],
)
def test_bad_arguments_write_nothing(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"users": 5, "events": 10, **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        generate_clickstream(tmp_path / "out", **args)
    assert not (tmp_path / "out").exists()


def test_sessions_look_like_sessions(tmp_path: Path) -> None:
    result = generate_clickstream(tmp_path, users=100, events=3000, files=1, seed=3)
    by_user: dict[str, list[datetime]] = {}
    for line in records(result.files)[0]:
        record = json.loads(line)
        by_user.setdefault(record["user_id"], []).append(_must_time(record["event_time"]))
    sessions = sum(
        1 + sum((b - a).total_seconds() >= 1800 for a, b in itertools.pairwise(ts))
        for ts in (sorted(t) for t in by_user.values())
    )
    assert 2 <= 3000 / sessions <= 20

