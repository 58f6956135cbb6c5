"""The Airflow end of the DAG files' wiring: what every DAG builds the same way, typed.

TaskFlow hands a task's result to the tasks after it as an ``XComArg``, which becomes the
value only when they run. Airflow's type hints say neither that an operator argument may be
one, nor that a ``multiple_outputs`` result can be indexed, nor that a task called with
another's result receives its value. The few places that say so are here, so that mypy
checks the DAG files themselves. Imported by the DAG files only: the rest of the package,
and the Spark jobs, run without Airflow.
"""

from __future__ import annotations

from typing import Any, cast

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import XComArg, get_current_context
from airflow.sdk.definitions.xcom_arg import PlainXComArg

from sessionlake.orchestration import JOB_SCRIPT, unknown_param

#: The Airflow connection whose host is the Spark master the DAGs submit to.
SPARK_CONNECTION = "spark_default"


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
        raise unknown_param(name, conf[name], sorted(declared))
    return dict(context["params"])


def at_run_time(result: XComArg) -> Any:
    """Another task's result as the task it is passed to receives it: its value."""
    return result


def submit_job(
    job: XComArg, *, task_id: str, name: str, **operator_args: Any
) -> SparkSubmitOperator:
    """A spark-submit of ``jobs/sessionlake_job.py`` with the arguments, conf and
    environment that ``job`` (a ``multiple_outputs`` task returning
    :class:`sessionlake.orchestration.SparkJob`) decided when it ran.

    :param operator_args: any other :class:`SparkSubmitOperator` argument (``pool``...).
    """
    fields = cast(PlainXComArg, job)
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id=SPARK_CONNECTION,
        application=str(JOB_SCRIPT),
        application_args=at_run_time(fields["args"]),
        conf=at_run_time(fields["conf"]),
        env_vars=at_run_time(fields["env"]),
        name=name,
        **operator_args,
    )
