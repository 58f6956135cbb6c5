"""
### sessionlake_backfill

Re-sessionize the accepted `events` of a date range (inclusive) and replace that range in
`sessions`: `sessionlake backfill --from FROM --to TO --gap GAP`. Session ids are
deterministic, so a backfill of unchanged events gives the same sessions.

Params: `from_date`, `to_date` (ISO dates, from <= to), `gap_minutes` (minutes, or a
duration such as `45m`).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import dag_defaults, submit_job, trigger_params
from sessionlake.config import Settings

with DAG(
    dag_id="sessionlake_backfill",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    default_args=dag_defaults(),
    params={
        "from_date": Param(type="string", format="date", description="first day, YYYY-MM-DD"),
        "to_date": Param(type="string", format="date", description="last day, YYYY-MM-DD"),
        "gap_minutes": Param(Settings.gap // timedelta(minutes=1), type=["integer", "string"],
                             description="inactivity gap: minutes, or a duration like 45m"),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_backfill_params(trigger_params())
        return orch.spark_job(orch.backfill_args(orch.locations_from_env(), checked))

    submit_job(validate_params(), task_id="backfill", name="sessionlake-backfill")
