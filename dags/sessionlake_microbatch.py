"""
### sessionlake_microbatch

Every five minutes, one **available-now** `sessionlake run` over the landing folder
(`SESSIONLAKE_SOURCE`) into the lake (`SESSIONLAKE_LAKE`): whatever files arrived since the
last run become one or more micro-batches, committed exactly once, then the job stops.

Never twice at once on one checkpoint: two runs would commit the same batch ids. Enforced
three times over: `max_active_runs=1` (one run of this DAG), `max_active_tis_per_dag=1` on
the run task, and the one-slot pool `sessionlake_checkpoint` shared with every task that
writes the checkpoint (restore, restart, retention, erasure, archive), so those queue
instead of colliding; the job itself refuses to start while another run holds the
checkpoint's lock. While a continuous run (the restart DAG's) holds it, a run is skipped:
that run reads the landing folder itself. While any other run holds it (one from the
command line, or one left hanging), a run fails in `validate_params`, naming its pid:
skipped, the DAG would stay green while nothing reads the landing folder.

When what landed since the last run is small (up to 32 MiB, in up to five micro-batches of
`SESSIONLAKE_MAX_FILES_PER_TRIGGER` files), the job's driver JVM compiles with C1 only,
which starts a short run faster (`SESSIONLAKE_DRIVER_JIT` overrides).

Params: `shuffle_partitions` (>= 1; may change between runs, the checkpoint has no state).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowSkipException

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import alert_on_dag_failure, dag_defaults, submit_job, trigger_params
from sessionlake.config import MICROBATCH_PERIOD, Settings

with DAG(
    dag_id="sessionlake_microbatch",
    doc_md=__doc__,
    schedule=MICROBATCH_PERIOD,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(hours=1),
    tags=["sessionlake", "streaming"],
    default_args=dag_defaults(),
    on_failure_callback=alert_on_dag_failure,
    params={
        "shuffle_partitions": Param(Settings.shuffle_partitions, type="integer", minimum=1,
                                    description="spark.sql.shuffle.partitions of this run"),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched; wait for a run
        from the command line that ends by itself, and skip the run while a continuous run
        reads the landing folder itself."""
        checked = orch.validate_microbatch_params(trigger_params())
        locations = orch.locations_from_env()
        if (busy := orch.microbatch_skip_reason(locations)) is not None:
            raise AirflowSkipException(busy)
        return orch.microbatch_job(locations, checked)

    submit_job(validate_params(), task_id="run_microbatch", name="sessionlake-microbatch",
               pool=orch.CHECKPOINT_POOL, max_active_tis_per_dag=1)
