"""
### sessionlake_restart

Stop the continuous `sessionlake run` and start it again at a new parallelism or on a new
master, from the same checkpoint:

1. find the run holding the checkpoint (`<checkpoint>/sessionlake.pid`), SIGTERM it and wait
   until it exits (graceful: the batch in flight commits first);
2. start `sessionlake run --trigger continuous --shuffle-partitions N --master M` detached
   (its output goes to `<checkpoint>/sessionlake-continuous.log`);
3. verify it resumed: a new `batch_metrics` commit of the same stream with a higher batch id
   within `SESSIONLAKE_RESTART_TIMEOUT` seconds (300), so data must be arriving.

With no run holding the checkpoint, steps 2 and 3 start one. The long-running job is a
detached process, not a SparkSubmitOperator: it must outlive this DAG run. The three
checkpoint steps run in the one-slot pool `sessionlake_checkpoint`, so no micro-batch or
restore task runs beside them. A micro-batch run may come between two of them (from the
same checkpoint: it loses and doubles nothing); step 3 counts only the new run's batches,
committed while it holds the checkpoint.

Params: `shuffle_partitions` (>= 1), `master` (`local[*]`, `local[N]`, `spark://host:port`;
empty, the default: the `spark_default` connection's master, where the other DAGs run).
Both are checked before anything is stopped, and a standalone master must answer; so is
`SESSIONLAKE_RESTART_TIMEOUT`, and the new run is asked whether it would start
(`sessionlake run ... --check-only`, with the workers' `SESSIONLAKE_*` settings it would
get: a format or gap other than the stream's is refused there, not after the stop).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, chain, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import (
    at_run_time,
    connection_master,
    dag_defaults,
    trigger_params,
)
from sessionlake.config import Settings

with DAG(
    dag_id="sessionlake_restart",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "streaming", "maintenance"],
    default_args=dag_defaults(),
    params={
        "shuffle_partitions": Param(Settings.shuffle_partitions, type="integer", minimum=1,
                                    description="spark.sql.shuffle.partitions of the "
                                                "restarted run"),
        "master": Param("", type="string",
                        description="empty: spark_default's master; local[N], spark://host:port"),
    },
):

    @task
    def validate_params() -> list[str]:
        """Check the params and build the new run's command before anything is stopped."""
        checked = orch.validate_restart_params(trigger_params(), connection_master())
        orch.restart_timeout()  # each refusal here, or the stream is stopped, and stays so
        orch.check_restart_master_answers(checked.master)
        args = orch.continuous_run_args(orch.locations_from_env(), checked)
        orch.check_run_would_start(args)
        return args

    @task(pool=orch.CHECKPOINT_POOL)
    def stop_running_stream() -> dict[str, Any]:
        """SIGTERM the run holding the checkpoint; return where its stream stopped."""
        where = orch.locations_from_env()
        stopped = orch.stop_continuous_run(where.checkpoint, orch.restart_timeout())
        return {"stopped_pid": stopped,
                **orch.stream_position(where.lake, where.checkpoint).as_xcom()}

    @task(pool=orch.CHECKPOINT_POOL)
    def start_stream(args: list[str]) -> dict[str, Any]:
        """Start the new continuous run, detached; return its pid and the stream's position
        just before it started."""
        return orch.started_run(orch.locations_from_env(), args)

    @task(pool=orch.CHECKPOINT_POOL)
    def verify_resumed(started: dict[str, Any]) -> dict[str, Any]:
        """Wait for a new batch of the same stream from the new run."""
        return orch.resumed_run(started, started["pid"])

    args = validate_params()
    stopped = stop_running_stream()
    started = start_stream(at_run_time(args))
    chain(args, stopped, started)
    verify_resumed(at_run_time(started))
