"""A Kafka stream's checks that need no broker (the others run against a real one in
``test_kafka_source.py``)."""

from __future__ import annotations

import pytest

from sessionlake.kafkastream import kafka_records_lost


@pytest.mark.parametrize(("resume", "earliest", "lost"), [
    ({0: 10, 1: 10}, {0: 0, 1: 10}, {}),  # nothing deleted that was not read
    ({0: 10, 1: 10}, {0: 14, 1: 10}, {0: (10, 14)}),  # retention outran partition 0
    ({0: 10}, {0: 10, 1: 0}, {}),  # a partition added since, whole
    ({0: 10}, {0: 10, 1: 3}, {1: (0, 3)}),  # ... whose first records are gone
])
def test_records_lost_run_from_where_the_stream_reads_on_to_the_topic_s_first(
    resume: dict[int, int], earliest: dict[int, int], lost: dict[int, tuple[int, int]]
) -> None:
    assert kafka_records_lost(resume, earliest) == lost
