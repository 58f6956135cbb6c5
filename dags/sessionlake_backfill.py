"""
### sessionlake_backfill

Re-sessionize the accepted `events` of a date range (inclusive) and replace that range in
`sessions`: `sessionlake backfill --from FROM --to TO --gap GAP`. Session ids are
deterministic, so a backfill of unchanged events gives the same sessions.

Params: `from_date`, `to_date` (ISO dates, from <= to), `gap_minutes` (minutes, or a
duration such as `45m`).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch

with DAG(
    dag_id="sessionlake_backfill",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    params={
        "from_date": Param(type="string", format="date", description="first day, YYYY-MM-DD"),
        "to_date": Param(type="string", format="date", description="last day, YYYY-MM-DD"),
        "gap_minutes": Param(30, type=["integer", "string"],
                             description="inactivity gap: minutes, or a duration like 45m"),
    },
):

    @task(multiple_outputs=True)
    def validate_params(params: dict[str, Any]) -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_backfill_params(params)
        return orch.spark_job(orch.backfill_args(orch.locations_from_env(), checked))

    job = validate_params()
    SparkSubmitOperator(
        task_id="backfill",
        conn_id="spark_default",
        application=str(orch.JOB_SCRIPT),
        application_args=job["args"],
        conf=job["conf"],
        env_vars=job["env"],
        name="sessionlake-backfill",
    )
