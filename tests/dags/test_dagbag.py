"""Every DAG file loads, with the seven ids the spec names, each documented and tagged."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.dags.conftest import DAGS

DAG_IDS = {
    "sessionlake_microbatch", "sessionlake_backfill", "sessionlake_compaction",
    "sessionlake_snapshot", "sessionlake_restore", "sessionlake_retention",
    "sessionlake_restart",
}
PARAMS = {
    "sessionlake_microbatch": {"shuffle_partitions"},
    "sessionlake_backfill": {"from_date", "to_date", "gap_minutes"},
    "sessionlake_compaction": {"min_files"},
    "sessionlake_snapshot": {"name"},
    "sessionlake_restore": {"snapshot_id"},
    "sessionlake_retention": {"erase_user_ids", "sessions_max_age_days",
                              "events_max_age_days", "vacuum_retain_hours"},
    "sessionlake_restart": {"shuffle_partitions", "master"},
}


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_no_import_errors_and_exactly_the_seven_dags(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_each_dag_is_documented_tagged_and_validates_first(dagbag: Any, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    assert dag.doc_md and dag_id in dag.doc_md
    assert "sessionlake" in dag.tags
    assert dag.catchup is False
    assert set(dag.params.keys()) == PARAMS[dag_id]
    # The params are checked before any other task runs.
    assert [t.task_id for t in dag.roots] == ["validate_params"]


def test_microbatch_never_runs_twice_at_once(dagbag: Any) -> None:
    dag = dagbag.dags["sessionlake_microbatch"]
    assert dag.max_active_runs == 1
    assert dag.schedule == timedelta(minutes=5)
