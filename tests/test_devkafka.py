"""The development broker's helpers (the broker itself runs in tests/test_kafka_source.py)."""

from __future__ import annotations

import uuid

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
