"""
### sessionlake_compaction

Daily `sessionlake compact --min-files N`: OPTIMIZE, clustered by user, the tables where at
least N small files have piled up. Safe beside the stream (a concurrent commit is retried).

Params: `min_files` (>= 1).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import dag_defaults, submit_job, trigger_params
from sessionlake.config import COMPACTION_MIN_FILES

with DAG(
    dag_id="sessionlake_compaction",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    default_args=dag_defaults(),
    params={
        "min_files": Param(COMPACTION_MIN_FILES, type="integer", minimum=1,
                           description="compact a table holding at least this many small "
                                       "files, in its partitions with two or more"),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_compaction_params(trigger_params())
        return orch.spark_job(orch.compaction_args(orch.locations_from_env(), checked))

    submit_job(validate_params(), task_id="compact", name="sessionlake-compaction")
