"""
### sessionlake_archive

Daily: move the landing folder's files that no restore can make the stream read again
(read by the checkpoint's committed batches and by every snapshot's copy of it) to an
archive folder, each to the same path below it. Files read and left in the landing folder
cost every micro-batch run its listing. A file move, no Spark job; safe beside the stream.
While no stream runs, the checkpoint's file source log then forgets the files archived
(else the running stream does it: a continuous one between two batches, any at its next
start); that writes the checkpoint, so the task runs in
the one-slot pool `sessionlake_checkpoint`, never beside a micro-batch run.

Params: `archive_to` (a folder outside the landing folder, inside `SESSIONLAKE_ARCHIVE` or
a folder listed in `SESSIONLAKE_ARCHIVE_ROOTS` of the workers' environment; empty:
`SESSIONLAKE_ARCHIVE` itself), `dry_run` (only count what would move).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import (
    at_run_time,
    dag_defaults,
    trigger_params,
)

with DAG(
    dag_id="sessionlake_archive",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    default_args=dag_defaults(),
    params={
        "archive_to": Param(None, type=["null", "string"],
                            description="folder to move read files to (default "
                                        "$SESSIONLAKE_ARCHIVE): outside the landing folder "
                                        "and the lake, inside $SESSIONLAKE_ARCHIVE or a "
                                        "folder $SESSIONLAKE_ARCHIVE_ROOTS lists"),
        "dry_run": Param(False, type="boolean", description="only count what would move"),
    },
):

    @task
    def validate_params() -> dict[str, Any]:
        """Check the params and the folders before any file moves (a dict: what XCom
        carries)."""
        checked = orch.validate_archive_params(trigger_params())
        orch.check_archive_possible(orch.locations_from_env(), checked)
        return asdict(checked)

    @task(pool=orch.CHECKPOINT_POOL)
    def archive(checked: dict[str, Any]) -> str:
        """Move the files, then trim the checkpoint's source log (which writes the
        checkpoint: hence the pool); the summary line is the task's result and log."""
        summary = orch.archive_landing(orch.locations_from_env(), orch.ArchiveParams(**checked))
        print(summary)
        return summary

    archive(at_run_time(validate_params()))
