"""The Airflow end of the DAG files' wiring: what every DAG builds the same way, typed.

TaskFlow hands a task's result to the tasks after it as an ``XComArg``, which becomes the
value only when they run. Airflow's type hints say neither that an operator argument may be
one, nor that a ``multiple_outputs`` result can be indexed, nor that a task called with
another's result receives its value. The few places that say so are here, so that mypy
checks the DAG files themselves. Imported by the DAG files only: the rest of the package,
and the Spark jobs, run without Airflow.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import subprocess
import urllib.request
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, XComArg, get_current_context
from airflow.sdk.definitions.xcom_arg import PlainXComArg

from sessionlake.config import VACUUM_RETAIN_HOURS
from sessionlake.orchestration import (
    ALERT_WEBHOOK_ENV,
    JOB_SCRIPT,
    child_env,
    python_executable,
    unknown_param,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The Airflow connection whose host is the Spark master the DAGs submit to.
SPARK_CONNECTION = "spark_default"
#: How long a webhook has to answer: the alert waits in the failed task's process.
ALERT_WEBHOOK_TIMEOUT_S = 10.0

log = logging.getLogger("sessionlake.alerts")


def dag_defaults() -> dict[str, Any]:
    """What every sessionlake DAG gives its tasks: a failure is told
    (:func:`alert_on_failure`)."""
    return {"on_failure_callback": alert_on_failure}


def alert_on_dag_failure(context: Context) -> None:
    """Tell a DAG run's failure that no task's tells: a run past its ``dagrun_timeout``
    (a micro-batch stuck for an hour) has its tasks skipped, not failed, so only the DAG's
    own callback sees it. A run failed by a task is told by the task's
    (:func:`alert_on_failure`), once.

    For a DAG with a ``dagrun_timeout`` only (the micro-batch DAG), whose params all have
    defaults: Airflow builds a DAG callback's context from the DAG's params without the
    run's conf, and a param without a default then fails the callback
    (``ParamValidationError``), as ``dag.test()`` of the restore DAG showed.
    """
    run = context["dag_run"]
    reason = str(context.get("reason") or "failed")
    if reason == "task_failure":
        return
    _deliver({"text": f"ALERT sessionlake DAG {run.dag_id} run {run.run_id} failed: {reason}",
              "dag_id": run.dag_id, "task_id": None, "run_id": run.run_id,
              "try_number": None, "error": reason})


#: How the Spark provider ends a spark-submit that failed, before its last output lines.
_SUBMIT_STATUS = re.compile(r"Error code is: (-?\d+)\.")


def alert_cause(error: str) -> str:
    """The line of a failed task's ``error`` that says why: the last line a sessionlake
    command said (``sessionlake: ...``: its error or its interruption), else, for a
    spark-submit killed by a signal (a task marked failed in the UI, the OOM killer),
    that; else the error's last line. The Spark provider's error ends with the job's
    last output lines, Spark's own warnings among them: the last line alone quoted
    "WARN SparkSession: Using an existing Spark session" for a killed erasure."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("sessionlake: ")]
    if said:
        return said[-1]
    status = _SUBMIT_STATUS.search(error)
    if status is not None and int(status.group(1)) < 0:
        return (f"spark-submit was killed by signal {-int(status.group(1))} (the task was "
                "stopped, or the machine killed the job); running it again finishes what "
                "it began")
    return lines[-1] if lines else "no error given"


def failure_alert(context: Context) -> dict[str, Any]:
    """What is told of a failed task: its DAG, task, run, try and error, and the ``ALERT``
    line that sums them up (:func:`alert_cause`)."""
    ti = context["ti"]
    cause = alert_cause(str(context.get("exception") or ""))
    fields = {"dag_id": ti.dag_id, "task_id": ti.task_id, "run_id": ti.run_id,
              "try_number": ti.try_number, "error": cause}
    text = (f"ALERT sessionlake DAG {ti.dag_id} task {ti.task_id} failed (run {ti.run_id}, "
            f"try {ti.try_number}): {cause}")
    return {"text": text, **fields}


def alert_on_failure(context: Context) -> None:
    """Tell a task's failure in an ``ALERT`` line of its log and, when
    ``SESSIONLAKE_ALERT_WEBHOOK`` is set, to that URL: a maintenance DAG that fails at
    night (a restore refused, an erasure that could not run) is otherwise seen only by
    whoever opens the UI. A webhook that fails is logged (without its URL, which may hold
    a token), never raised: the task has failed already."""
    _deliver(failure_alert(context))


def _deliver(alert: dict[str, Any]) -> None:
    """Log ``alert``'s line, and POST it to ``SESSIONLAKE_ALERT_WEBHOOK`` when set."""
    log.error("%s", alert["text"])
    url = os.environ.get(ALERT_WEBHOOK_ENV, "").strip()
    if not url:
        return
    try:
        request = urllib.request.Request(url, data=json.dumps(alert).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=ALERT_WEBHOOK_TIMEOUT_S) as answer:
            answer.read()
    except Exception as error:  # whatever it is, the task has failed already
        # Not the error's text: a malformed URL's quotes the URL, token and all.
        status = getattr(error, "code", None)
        log.error("the alert was not delivered to %s: %s%s", ALERT_WEBHOOK_ENV,
                  type(error).__name__, f" (HTTP {status})" if status else "")


def connection_master() -> str:
    """The master the DAGs' spark-submits run on: the ``spark_default`` connection's, as
    the Spark provider reads it (a ``spark`` connection's host may be a whole URL, or a
    host with a port beside it)."""
    return str(SparkSubmitHook(conn_id=SPARK_CONNECTION)._connection["master"])


def trigger_params() -> dict[str, Any]:
    """The params of the running DAG run (the trigger form's values, or their defaults),
    from inside a task.

    :raises ValueError: for a key of the run's conf that is no param of the DAG: Airflow
        accepts it and runs with the defaults, so a misspelt ``shuffle_partition`` would
        go unseen.
    """
    context = get_current_context()
    conf = dict(context["dag_run"].conf or {})
    declared = set(context["dag"].params)
    for name in sorted(set(conf) - declared):
        raise unknown_param(name, sorted(declared))
    return dict(context["params"])


def users_to_erase_params() -> dict[str, Param]:
    """The params naming users to erase, which the retention and erasure DAGs share:
    their ids, or the SHA-256 of their ids (the DAG run's conf then holds no id)."""
    return {
        "erase_user_ids": Param([], type="array", items={"type": "string", "minLength": 1},
                                description="users to erase from every table"),
        "erase_user_sha256": Param(
            [], type="array", items={"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
            description="users to erase, by the SHA-256 (hex) of their id: the run's conf "
                        "then holds no id"),
    }


def vacuum_params() -> dict[str, Param]:
    """The VACUUM after an erasure or the age limits, and the dry run, which the retention
    and erasure DAGs share."""
    return {
        "vacuum_retain_hours": Param(
            VACUUM_RETAIN_HOURS, type=["null", "integer"], minimum=0,
            description="VACUUM after, removing files unused for longer than this many "
                        "hours (files a kept snapshot needs stay); null: no VACUUM, and "
                        "deleted rows stay readable by time travel until one"),
        "dry_run": Param(False, type="boolean",
                         description="only count what it would delete; change nothing"),
    }


def at_run_time(result: XComArg) -> Any:
    """Another task's result as the task it is passed to receives it: its value."""
    return result


def submit_job(
    job: XComArg, *, task_id: str, name: str, **operator_args: Any
) -> SparkSubmitOperator:
    """A spark-submit of ``jobs/sessionlake_job.py`` with the arguments, conf and
    environment that ``job`` (a ``multiple_outputs`` task returning
    :class:`sessionlake.orchestration.SparkJob`) decided when it ran; or, for a job that
    says ``local``, the same command as a child process (:class:`SessionlakeJobOperator`).

    :param operator_args: any other :class:`SparkSubmitOperator` argument (``pool``...).
    """
    fields = cast(PlainXComArg, job)
    return SessionlakeJobOperator(
        task_id=task_id,
        conn_id=SPARK_CONNECTION,
        application=str(JOB_SCRIPT),
        application_args=at_run_time(fields["args"]),
        conf=at_run_time(fields["conf"]),
        env_vars=at_run_time(fields["env"]),
        local=at_run_time(fields["local"]),
        name=name,
        **operator_args,
    )


class SessionlakeJobOperator(SparkSubmitOperator):
    """A spark-submit of one ``sessionlake`` command, or, when ``local`` is true, the same
    command run by the worker as a child process, with the connection's master for any
    step that needs Spark (:func:`sessionlake.orchestration.needs_no_submit`: a snapshot
    or a restore of a lake on local disks, which needs no driver JVM of its own).

    The child's output goes to the task log line by line; a stopped task sends it SIGTERM
    (its batch in flight commits), then SIGKILL after a minute. The Spark provider kills a
    spark-submit at once (SIGKILL): its batch in flight is cut off and replayed by the next
    run.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "local")

    def __init__(self, *, local: Any = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.local = local
        self._child: subprocess.Popen[str] | None = None

    def execute(self, context: Context) -> None:
        """Run the command: spark-submitted, or in a child process when ``local``."""
        if not self.local:
            return super().execute(context)
        args = [*(self.application_args or []), "--master", connection_master()]
        self.log.info("sessionlake %s (a lake on local disks: run here, not spark-submitted)",
                      shlex.join(args))
        self._child = subprocess.Popen(
            [python_executable(), "-m", "sessionlake.cli", *args],
            env={**child_env(), **(self.env_vars or {})}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        said: deque[str] = deque(maxlen=5)
        assert self._child.stdout is not None
        for line in self._child.stdout:
            said.append(line.rstrip())
            self.log.info("%s", said[-1])
        if self._child.wait() != 0:
            raise RuntimeError(f"sessionlake {args[0]} exited with status "
                               f"{self._child.returncode}: " + " | ".join(said))
        return None

    def on_kill(self) -> None:
        """Stop the child (SIGTERM; SIGKILL after 60 s), or the spark-submit."""
        if not self.local:
            return super().on_kill()
        if self._child is not None and self._child.poll() is None:
            self._child.terminate()
            try:
                self._child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._child.kill()
        return None
