"""The restart benchmark's order and averaging (the measurements themselves run in bench/)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.restart import mean_restart, restart_order


@pytest.mark.parametrize(("sizes", "order"), [
    ([10_000, 100_000, 1_000_000], [10_000, 100_000, 1_000_000, 1_000_000, 100_000, 10_000]),
    ([1_000_000, 10_000], [10_000, 1_000_000, 1_000_000, 10_000]),
    ([10_000], [10_000, 10_000]),
])
def test_every_size_is_measured_twice_at_mirrored_places(
    sizes: list[int], order: list[int]
) -> None:
    assert restart_order(sizes) == order


def _run(first_commit: float, peer_first_commit: float, duration_ms: int) -> dict[str, Any]:
    return {
        "size": 10_000, "peer_state_rows": 10_000,
        "sessionlake_batch": {"batch_id": 1, "open_sessions": 10_000,
                              "duration_ms": duration_ms},
        "sessionlake_build_s": 15.0, "sessionlake_first_commit_s": first_commit,
        "sessionlake_process_s": first_commit + 1, "peer_build_s": 9.0,
        "peer_first_commit_s": peer_first_commit, "peer_process_s": peer_first_commit + 2,
        "ratio_first_commit": first_commit / peer_first_commit,
        "ratio_process": (first_commit + 1) / (peer_first_commit + 2),
    }


def test_a_size_reports_the_mean_of_its_runs_and_the_ratio_of_the_means() -> None:
    result = mean_restart([_run(18.0, 8.0, 13_000), _run(14.0, 12.0, 11_000)])

    assert result["runs"] == 2
    assert result["sessionlake_first_commit_s"] == 16.0
    assert result["peer_first_commit_s"] == 10.0
    assert result["sessionlake_process_s"] == 17.0
    assert result["ratio_first_commit"] == 1.6  # of the means, not the mean of 2.25 and 1.17
    assert result["ratio_process"] == 17.0 / 12.0
    assert [b["duration_ms"] for b in result["sessionlake_batches"]] == [13_000, 11_000]
