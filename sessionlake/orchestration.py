"""What the Airflow DAGs need from sessionlake, in one place and free of Airflow.

The DAG files in ``dags/`` only wire tasks together; everything they decide lives here so it
can be tested as plain functions:

- **locations**: the lake, landing folder and checkpoint, from ``SESSIONLAKE_LAKE``,
  ``SESSIONLAKE_SOURCE`` and ``SESSIONLAKE_CHECKPOINT`` (:func:`locations_from_env`);
- **params**: one ``validate_*_params`` function per DAG turns the UI trigger's params into a
  typed value, or raises :class:`ValueError` naming the param, its value and why;
- **command lines**: one ``*_args`` function per job builds the ``sessionlake`` CLI's argv.
  Every value is its own argv item (free text as ``--flag=value``, so that a value starting
  with ``-`` is never read as a flag); nothing is formatted into SQL or a shell line;
- **spark-submit**: the conf and environment of ``jobs/sessionlake_job.py``
  (:func:`spark_job`);
- **restart**: stop the continuous run that holds the checkpoint, start a new one detached,
  and wait until it has committed a batch of the same stream (:func:`stop_continuous_run`,
  :func:`start_continuous_run`, :func:`wait_for_resumed_stream`); the restore DAG does the
  same around its restore, for the restart DAG's run (:func:`stop_for_restore`); the
  scheduler's container stops it as it stops (:func:`stop_restart_dag_run`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any, TypedDict

from sessionlake.archive import (
    ArchiveTargetError,
    archive_read_files,
    check_archive_request,
    warn_of_read_files_left,
)
from sessionlake.checkpoint import (
    CONTINUOUS_LOG,
    CONTINUOUS_RUN,
    lock_held,
    read_stream_identity,
    unread_input,
)
from sessionlake.config import (
    JAVA_INT_MAX,
    MAX_AGE_DAYS,
    SPARK_MASTER,
    SPARK_MASTER_FORMS,
    ConfigError,
    Settings,
    format_duration,
    parse_duration,
    restart_timeout,
    settings_from,
    whole_number,
)
from sessionlake.deltalog import batch_keys, commit_actions
from sessionlake.erasure import USER_HASH, user_hash
from sessionlake.locks import Holder, checkpoint_holder
from sessionlake.spark import (
    PROJECT_ROOT,
    check_master_answers,
    default_conf,
    driver_memory,
    is_local_master,
    java_options,
    local_fs_conf,
    quick_start_for,
    spark_jars,
)
from sessionlake.storage import local_path, within

log = logging.getLogger(__name__)

#: The spark-submit entry point every Spark task runs.
JOB_SCRIPT = PROJECT_ROOT / "jobs" / "sessionlake_job.py"
#: Where the archive DAG moves read landing files when its ``archive_to`` param is empty.
ARCHIVE_ENV = "SESSIONLAKE_ARCHIVE"
#: Folders, besides ``SESSIONLAKE_ARCHIVE``, that a trigger's ``archive_to`` may lie in.
ARCHIVE_ROOTS_ENV = "SESSIONLAKE_ARCHIVE_ROOTS"
#: The Airflow pool of the tasks that write the streaming checkpoint (micro-batch run,
#: restore, restart, retention's erasure, the archive's trim of the source log): one
#: slot, so that Airflow never runs two of them at once, across DAGs. ``make airflow``
#: and docker/ create it.
CHECKPOINT_POOL = "sessionlake_checkpoint"

_IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


# --- locations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Locations:
    """Where a DAG's job reads and writes: absolute paths or URIs."""

    lake: str
    source: str | None
    checkpoint: str


def locations_from_env(env: Mapping[str, str] | None = None) -> Locations:
    """The lake, landing folder and checkpoint from ``SESSIONLAKE_*`` variables.

    :param env: the environment (default ``os.environ``).
    :return: the locations; the checkpoint defaults to ``<lake>/_checkpoints/stream``.
    :raises ValueError: when ``SESSIONLAKE_LAKE`` is not set.
    """
    try:
        settings = settings_from({}, env=os.environ if env is None else env)
    except ConfigError as error:
        raise ValueError(f"{error} in the Airflow workers' environment") from None
    return Locations(settings.lake, settings.source, settings.checkpoint)


def _need_source(locations: Locations) -> str:
    if not locations.source:
        raise ValueError(
            "SESSIONLAKE_SOURCE is not set: set it to the landing folder in the Airflow "
            "workers' environment"
        )
    return locations.source


# --- params ----------------------------------------------------------------------------


#: A number without a unit.
_BARE_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")
_SIGNED_NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?$")


def _bad(name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"param {name}={value!r} is invalid: {why}")


def unknown_param(name: str, declared: Sequence[str]) -> ValueError:
    """The error for a key of a DAG run's conf that is none of the DAG's params. It takes
    no value to repeat: a misspelt ``erase_user_ids`` holds the ids of people being erased,
    and the error goes to the task's log."""
    return ValueError(f"param {name} is invalid: no such param (this DAG's: "
                      f"{', '.join(declared) or 'none'})")


def _whole(params: Mapping[str, Any], name: str, minimum: int,
           maximum: int = JAVA_INT_MAX) -> int:
    """``params[name]`` as a whole number from ``minimum`` to ``maximum``."""
    value = params.get(name)
    wanted = f"must be a whole number from {minimum} to {maximum}"
    if not isinstance(value, int | str):
        raise _bad(name, value, wanted)
    try:
        return whole_number(value, name, minimum, maximum)
    except ConfigError:
        raise _bad(name, value, wanted) from None


def _optional_whole(params: Mapping[str, Any], name: str, minimum: int,
                    maximum: int = JAVA_INT_MAX) -> int | None:
    return None if params.get(name) is None else _whole(params, name, minimum, maximum)


def _iso_date(params: Mapping[str, Any], name: str) -> date:
    value = params.get(name)
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise _bad(name, value, "must be an ISO date like 2026-01-31") from None


def _identifier(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise _bad(
            name, value,
            "must be 1-128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit",
        )
    return value


@dataclass(frozen=True)
class MicrobatchParams:
    """``sessionlake_microbatch``: one available-now run over the landing folder."""

    shuffle_partitions: int


@dataclass(frozen=True)
class BackfillParams:
    """``sessionlake_backfill``: re-sessionize ``from_date``..``to_date`` (inclusive)."""

    from_date: date
    to_date: date
    gap: timedelta


@dataclass(frozen=True)
class CompactionParams:
    """``sessionlake_compaction``: compact tables with at least ``min_files`` small files."""

    min_files: int


@dataclass(frozen=True)
class SnapshotParams:
    """``sessionlake_snapshot``: a restore point, optionally named, then the expiry of the
    snapshots older than ``max_age_days`` but for the ``keep_last`` newest (``None``: no
    such rule)."""

    name: str | None
    max_age_days: int | None = None
    keep_last: int | None = None


@dataclass(frozen=True)
class RestoreParams:
    """``sessionlake_restore``: return tables and checkpoint to ``snapshot_id``."""

    snapshot_id: str


@dataclass(frozen=True)
class RetentionParams:
    """``sessionlake_retention``: erasures, age limits (``None``: no limit) and VACUUM."""

    #: The users to erase, by the SHA-256 of their id: the ids themselves stay out of the
    #: task logs (this return value, the job's command line).
    erase_user_sha256: tuple[str, ...]
    sessions_max_age_days: int | None
    events_max_age_days: int | None
    vacuum_retain_hours: int | None
    dry_run: bool = False


@dataclass(frozen=True)
class ArchiveParams:
    """``sessionlake_archive``: where read landing files go, or only count them."""

    archive_to: str
    dry_run: bool


@dataclass(frozen=True)
class RestartParams:
    """``sessionlake_restart``: the new continuous run's parallelism and master."""

    shuffle_partitions: int
    master: str


def validate_microbatch_params(params: Mapping[str, Any]) -> MicrobatchParams:
    """Check the micro-batch DAG's params.

    Example::

        validate_microbatch_params({"shuffle_partitions": 8})  # MicrobatchParams(8)

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    return MicrobatchParams(_whole(params, "shuffle_partitions", 1))


def validate_backfill_params(params: Mapping[str, Any]) -> BackfillParams:
    """Check the backfill DAG's params: ISO dates with ``from_date <= to_date`` and a gap.

    ``gap_minutes`` is a number of minutes (``30``) or a duration (``30m``, ``1h``).

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    first, last = _iso_date(params, "from_date"), _iso_date(params, "to_date")
    if first > last:
        raise _bad("from_date", params.get("from_date"),
                   f"must not be after to_date={params.get('to_date')!r}")
    value = params.get("gap_minutes")
    if isinstance(value, bool) or value is None:
        raise _bad("gap_minutes", value, "must be minutes (30) or a duration (30m, 1h)")
    text = str(value).strip()
    if _SIGNED_NUMBER.match(text) and float(text) <= 0:
        raise _bad("gap_minutes", value, "must be longer than 0")
    try:
        # A bare number is minutes, as the param's name says, a fraction too (1.5: 90 s).
        gap = parse_duration(f"{text}m" if _BARE_NUMBER.match(text) else text, "gap_minutes")
    except ConfigError as error:
        raise _bad("gap_minutes", value, str(error)) from None
    if gap <= timedelta(0):
        raise _bad("gap_minutes", value, "must be longer than 0")
    return BackfillParams(first, last, gap)


def validate_compaction_params(params: Mapping[str, Any]) -> CompactionParams:
    """Check the compaction DAG's params (``min_files >= 1``).

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    return CompactionParams(_whole(params, "min_files", 1))


def validate_snapshot_params(params: Mapping[str, Any]) -> SnapshotParams:
    """Check the snapshot DAG's params: an optional name made of safe characters, and the
    expiry's ``max_age_days`` and ``keep_last`` (whole numbers >= 1, or ``None``).

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    name = None if params.get("name") in (None, "") else _identifier(params, "name")
    return SnapshotParams(name, _optional_whole(params, "max_age_days", 1, MAX_AGE_DAYS),
                          _optional_whole(params, "keep_last", 1))


def validate_restore_params(params: Mapping[str, Any]) -> RestoreParams:
    """Check the restore DAG's params: the id ``sessionlake snapshot`` printed.

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    return RestoreParams(_identifier(params, "snapshot_id"))


def _flag(params: Mapping[str, Any], name: str) -> bool:
    """The boolean param ``name`` (false when absent)."""
    value = params.get(name, False)
    if not isinstance(value, bool):
        raise _bad(name, value, "must be true or false")
    return value


def validate_retention_params(params: Mapping[str, Any]) -> RetentionParams:
    """Check the retention DAG's params.

    ``erase_user_ids`` is a list of non-empty strings, ``erase_user_sha256`` a list of the
    SHA-256 of ids (64 hex digits: a DAG run's conf, which Airflow keeps, then holds no
    id); the age limits are days >= 1 and ``vacuum_retain_hours`` hours >= 0; ``None``
    leaves a limit out. ``dry_run`` (true or false) only counts what the run would delete.

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    users = params.get("erase_user_ids") or []
    if not isinstance(users, list | tuple):
        raise _bad("erase_user_ids", "...", "must be a list of user ids")
    for number, user in enumerate(users, start=1):
        if not isinstance(user, str) or not user.strip():
            # The list is not repeated: it holds the ids of people being erased.
            raise _bad("erase_user_ids", f"[{len(users)} ids]",
                       f"{user!r} is not a non-empty string")
        if user != user.strip():
            # Pasted into the trigger form with a space, it would match no row and the
            # run would succeed having erased nobody (the Airflow review).
            raise _bad("erase_user_ids", f"[{len(users)} ids]",
                       f"entry {number} begins or ends with white space, and ids are "
                       "matched exactly: give it without, or, where the space is part of "
                       "the id, its SHA-256 in erase_user_sha256")
    hashes = params.get("erase_user_sha256") or []
    # Nor are these repeated: a user id given here by mistake would go to the task's log.
    if not isinstance(hashes, list | tuple):
        raise _bad("erase_user_sha256", "...", "must be a list of SHA-256 hex digests")
    for number, digest in enumerate(hashes, start=1):
        if not isinstance(digest, str) or not USER_HASH.match(digest.lower()):
            raise _bad("erase_user_sha256", f"[{len(hashes)} entries]",
                       f"entry {number} is not a SHA-256 (64 hex digits); ids go in "
                       "erase_user_ids")
    checked = RetentionParams(
        erase_user_sha256=tuple(dict.fromkeys(
            [*(user_hash(u) for u in users), *(d.lower() for d in hashes)])),
        sessions_max_age_days=_optional_whole(params, "sessions_max_age_days", 1, MAX_AGE_DAYS),
        events_max_age_days=_optional_whole(params, "events_max_age_days", 1, MAX_AGE_DAYS),
        vacuum_retain_hours=_optional_whole(params, "vacuum_retain_hours", 0,
                                            MAX_AGE_DAYS * 24),
        dry_run=_flag(params, "dry_run"),
    )
    if not checked.erase_user_sha256 and checked.sessions_max_age_days is None \
            and checked.events_max_age_days is None and checked.vacuum_retain_hours is None:
        raise _bad("vacuum_retain_hours", None, "with no erasure and no age limit either, the "
                   "run would do nothing: give one of them")
    return checked


def validate_erasure_params(params: Mapping[str, Any]) -> RetentionParams:
    """Check the erasure DAG's params: the retention DAG's users, VACUUM and ``dry_run``,
    without age limits, and at least one user to erase.

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    if not (params.get("erase_user_ids") or params.get("erase_user_sha256")):
        raise _bad("erase_user_ids", [], "name the users to erase (erase_user_ids, or "
                   "erase_user_sha256); sessionlake_retention applies the age limits")
    return validate_retention_params(
        {**params, "sessions_max_age_days": None, "events_max_age_days": None})


def validate_archive_params(
    params: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> ArchiveParams:
    """``archive_to`` (else ``SESSIONLAKE_ARCHIVE`` of the workers' environment) and
    ``dry_run``; where the folder may lie is checked by :func:`check_archive_possible`.

    A folder the trigger names must lie inside ``$SESSIONLAKE_ARCHIVE`` or inside one of
    the folders listed in ``$SESSIONLAKE_ARCHIVE_ROOTS``: whoever may trigger the DAG
    could otherwise move the landing files anywhere the workers may write.
    """
    environ = os.environ if env is None else env
    named = params.get("archive_to")
    value = named or environ.get(ARCHIVE_ENV)
    if not isinstance(value, str) or not value.strip():
        raise _bad("archive_to", params.get("archive_to"),
                   f"name the folder to move read files to, or set {ARCHIVE_ENV} in the "
                   "Airflow workers' environment")
    local = local_path(value.strip())
    if local is not None and not local.is_absolute():
        # A worker resolves a relative path against its own working directory.
        raise _bad("archive_to", value, "must be an absolute path (a relative one would "
                   "land in the Airflow worker's working directory)")
    roots = [r for r in [environ.get(ARCHIVE_ENV, ""), *environ.get(
        ARCHIVE_ROOTS_ENV, "").split()] if r.strip()]
    if named and not any(within(value.strip(), root.strip()) for root in roots):
        raise _bad("archive_to", value, f"must lie inside {ARCHIVE_ENV} or a folder listed "
                   f"in {ARCHIVE_ROOTS_ENV} (whitespace-separated) of the workers' "
                   "environment, so that whoever may trigger the DAG cannot move the "
                   "landing files anywhere the workers may write"
                   + ("" if roots else "; neither is set"))
    return ArchiveParams(value.strip(), _flag(params, "dry_run"))


def validate_restart_params(
    params: Mapping[str, Any], connection_master: str | None = None
) -> RestartParams:
    """Check the restart DAG's params: partitions >= 1 and a Spark master URL.

    Masters: ``local``, ``local[N]``, ``local[*]``, ``spark://host:port[,host:port]``,
    ``yarn``, ``k8s://...``. An empty ``master`` means ``connection_master``, the master
    the other DAGs submit to (the ``spark_default`` connection's), so that a restart with
    the defaults keeps the stream where the DAGs run it: on a cluster, on the cluster.

    A master that is neither local, nor the connection's, nor listed in
    ``$SESSIONLAKE_RESTART_MASTERS`` is refused: whoever may trigger the DAG could
    otherwise move the stream, with its Kafka credentials and its data, to a cluster of
    their own.

    :raises ValueError: naming the param, its value and why it is wrong.
    """
    master = params.get("master")
    if master is None or (isinstance(master, str) and not master.strip()):
        master = connection_master
    if not isinstance(master, str) or not SPARK_MASTER.match(master.strip()):
        raise _bad("master", master, f"must be {SPARK_MASTER_FORMS}")
    master = master.strip()
    allowed = {connection_master, *os.environ.get(RESTART_MASTERS_ENV, "").split()}
    if not is_local_master(master) and master not in allowed:
        raise _bad("master", master, "is neither local nor the spark_default connection's "
                   f"master; list the masters the stream may move to in {RESTART_MASTERS_ENV} "
                   "(whitespace-separated) in the Airflow workers' environment")
    return RestartParams(_whole(params, "shuffle_partitions", 1), master)


def check_restart_master_answers(master: str) -> None:
    """Refuse, before the restart DAG stops anything, a standalone ``master`` that does not
    answer (:func:`~sessionlake.spark.check_master_answers`), naming where the DAG took it
    from: its param, not the command line's ``--master``."""
    check_master_answers(master, given_by="the DAG's param master; empty: the "
                                          "spark_default connection's")


#: Masters, besides local ones and the ``spark_default`` connection's, that the restart DAG
#: may move the stream to (whitespace-separated).
RESTART_MASTERS_ENV = "SESSIONLAKE_RESTART_MASTERS"


# --- command lines ---------------------------------------------------------------------


def _archive_settings(locations: Locations) -> Settings:
    return settings_from({"lake": locations.lake, "source": _need_source(locations),
                          "checkpoint": locations.checkpoint}, env={})


def check_archive_possible(locations: Locations, params: ArchiveParams) -> None:
    """Refuse, before the archive task starts, a target the files may not move to (inside
    the landing folder or the lake, or not on this machine), or folders that do not allow
    archiving (:func:`sessionlake.archive.check_archive_request`).

    :raises ValueError: naming ``archive_to`` when the target is the problem.
    """
    try:
        check_archive_request(_archive_settings(locations), params.archive_to)
    except ArchiveTargetError as error:
        raise _bad("archive_to", params.archive_to, str(error)) from None


def archive_landing(locations: Locations, params: ArchiveParams) -> str:
    """Move the landing folder's files no restore can make the stream read again
    (:func:`sessionlake.archive.archive_read_files`): a file move, no Spark job.

    :return: the one-line summary, for the task log.
    :raises ValueError: the folders do not allow it; nothing moved.
    """
    return archive_read_files(_archive_settings(locations), params.archive_to,
                              dry_run=params.dry_run).summary()


def _checkpoint(locations: Locations) -> list[str]:
    return ["--checkpoint", locations.checkpoint]


def microbatch_args(locations: Locations, params: MicrobatchParams) -> list[str]:
    """``sessionlake run`` over what is in the landing folder, then stop."""
    return ["run", "--source", _need_source(locations), "--lake", locations.lake,
            *_checkpoint(locations), "--trigger", "available-now",
            "--shuffle-partitions", str(params.shuffle_partitions)]


def continuous_run_args(locations: Locations, params: RestartParams) -> list[str]:
    """``sessionlake run`` that keeps running, at the restart's parallelism and master."""
    return ["run", "--source", _need_source(locations), "--lake", locations.lake,
            *_checkpoint(locations), "--trigger", "continuous",
            "--shuffle-partitions", str(params.shuffle_partitions), "--master", params.master]


def backfill_args(locations: Locations, params: BackfillParams) -> list[str]:
    """``sessionlake backfill`` of a date range from ``events``."""
    return ["backfill", "--lake", locations.lake, "--from", params.from_date.isoformat(),
            "--to", params.to_date.isoformat(), "--gap", format_duration(params.gap)]


def compaction_args(locations: Locations, params: CompactionParams) -> list[str]:
    """``sessionlake compact`` of the tables with at least ``min_files`` small files."""
    return ["compact", "--lake", locations.lake, "--min-files", str(params.min_files)]


def snapshot_args(locations: Locations, params: SnapshotParams) -> list[str]:
    """``sessionlake snapshot`` of the tables with the checkpoint, then its expiry."""
    name = [] if params.name is None else [f"--name={params.name}"]
    expiry = [*([] if params.max_age_days is None else ["--max-age-days",
                                                        str(params.max_age_days)]),
              *([] if params.keep_last is None else ["--keep-last", str(params.keep_last)])]
    return ["snapshot", "--lake", locations.lake, *_checkpoint(locations), *name, *expiry]


def restore_args(locations: Locations, params: RestoreParams) -> list[str]:
    """``sessionlake restore`` of the tables and the checkpoint to a snapshot."""
    return ["restore", "--lake", locations.lake, *_checkpoint(locations),
            f"--snapshot={params.snapshot_id}"]


def retention_args(locations: Locations, params: RetentionParams) -> list[str]:
    """``sessionlake retention``: erasures (one ``--erase-user-sha256`` each), limits,
    VACUUM."""
    args = ["retention", "--lake", locations.lake]
    args += [f"--erase-user-sha256={digest}" for digest in params.erase_user_sha256]
    limits = (("--sessions-max-age-days", params.sessions_max_age_days),
              ("--events-max-age-days", params.events_max_age_days),
              ("--vacuum-retain-hours", params.vacuum_retain_hours))
    for flag, value in limits:
        if value is not None:
            args += [flag, str(value)]
    return [*args, "--dry-run"] if params.dry_run else args


# --- spark-submit ----------------------------------------------------------------------


class SparkJob(TypedDict):
    """What a ``SparkSubmitOperator`` needs: application args, Spark conf, environment;
    and whether the command runs as a child process of the Airflow worker instead
    (``local``: see :func:`needs_no_submit`)."""

    args: list[str]
    conf: dict[str, str]
    env: dict[str, str]
    local: bool


def python_executable() -> str:
    """The interpreter for the driver and executors: ``$SESSIONLAKE_PYTHON`` or this one."""
    return os.environ.get("SESSIONLAKE_PYTHON") or sys.executable


def spark_submit_conf(quick_start: bool = False) -> dict[str, str]:
    """Spark conf for ``spark-submit``: sessionlake's defaults and the Delta jars.

    The driver JVM starts before the job's Python runs, so the jars, the driver memory
    (:func:`sessionlake.spark.driver_memory`), the Delta extension and the driver's
    compiler (C1 only with ``quick_start``: :func:`sessionlake.spark.quick_start_for`) go
    here, and so does the driver's file system for commits
    (:func:`sessionlake.spark.local_fs_conf`: the master, Airflow's connection's, is not
    known here). Tuning an administrator set in ``spark-defaults.conf`` is left to the file
    (:func:`sessionlake.spark.default_conf`).

    :raises sessionlake.spark.JarsMissingError: when the jars have not been fetched.
    """
    options = java_options(quick_start)
    return {
        **default_conf(),
        "spark.jars": spark_jars(),
        "spark.driver.memory": driver_memory(),
        **options,
        **local_fs_conf(None, options),
        "spark.pyspark.python": python_executable(),
    }


#: Environment variables of the Airflow worker that hold its configuration and secrets
#: (``AIRFLOW__API_AUTH__JWT_SECRET``, the database URL, connections, variables).
AIRFLOW_ENV_PREFIXES = ("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")


#: A URL that a failed task of a sessionlake DAG is POSTed to, as JSON whose ``text`` is
#: its ``ALERT`` line (what Slack's and Mattermost's incoming webhooks take); read by the
#: DAGs' failure callback (``sessionlake.airflow_tasks.alert_on_failure``), kept from the
#: processes tasks start (it may hold a token).
ALERT_WEBHOOK_ENV = "SESSIONLAKE_ALERT_WEBHOOK"


def child_env() -> dict[str, str]:
    """The environment of a ``sessionlake`` process a DAG task starts itself (a command on
    a local lake, the restart DAG's detached continuous run): the worker's, without
    Airflow's configuration and secrets, which sessionlake never reads and which a run
    that lasts days would otherwise keep in its environment, plus
    :func:`spark_submit_env`. (A spark-submit goes through the Spark provider's hook,
    which passes on the whole environment.)
    """
    kept = {name: value for name, value in os.environ.items()
            if not name.startswith(AIRFLOW_ENV_PREFIXES) and name != ALERT_WEBHOOK_ENV}
    return {**kept, **spark_submit_env()}


def spark_submit_env() -> dict[str, str]:
    """Environment of ``spark-submit``: the project's interpreter and package.

    ``PYTHONPATH`` puts this project first, so the submitted driver imports the same
    ``sessionlake`` as the DAG that built the job (and whose ``jobs/`` script and jars it
    runs), not another copy installed in the interpreter. The driver ships that package to
    the executors (:func:`sessionlake.spark.ship_package`). The alert webhook
    (:data:`ALERT_WEBHOOK_ENV`, which may hold a token) is blanked: the Spark provider
    hands a spark-submit the worker's whole environment.
    """
    inherited = os.environ.get("PYTHONPATH")
    return {
        ALERT_WEBHOOK_ENV: "",
        "PYSPARK_PYTHON": python_executable(),
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT), *([inherited] if inherited else [])]),
    }


def spark_job(args: Sequence[str], quick_start: bool = False, *,
              local: bool = False) -> SparkJob:
    """The ``SparkSubmitOperator`` inputs of one ``sessionlake`` command.

    :param local: run it as a child process of the worker, not through spark-submit: only
        for a command that starts Spark just for a step that needs one
        (:func:`needs_no_submit`).
    """
    return SparkJob(args=list(args), conf=spark_submit_conf(quick_start),
                    env=spark_submit_env(), local=local)


def needs_no_submit(locations: Locations) -> bool:
    """Whether a snapshot or a restore can run in the worker rather than spark-submitted:
    with the lake and the checkpoint on this machine's disks, it copies and writes files
    from their logs and starts Spark only for a step that needs one (then on the DAGs'
    master). A spark-submit spent about 5 s starting a driver JVM for a snapshot of under
    1 s."""
    return all(local_path(where) is not None for where in (locations.lake, locations.checkpoint))


def snapshot_job(locations: Locations, params: SnapshotParams) -> SparkJob:
    """The snapshot's job: in the worker when the lake is local (:func:`needs_no_submit`)."""
    return spark_job(snapshot_args(locations, params), local=needs_no_submit(locations))


def restore_job(locations: Locations, params: RestoreParams) -> SparkJob:
    """The restore's job: in the worker when the lake is local (:func:`needs_no_submit`)."""
    return spark_job(restore_args(locations, params), local=needs_no_submit(locations))


def restore_check_job(job: SparkJob) -> SparkJob:
    """The restore ``job`` as a check that changes nothing (``--check-only``), which the
    restore DAG runs before it stops the continuous run."""
    return {**job, "args": [*job["args"], "--check-only"]}


def microbatch_job(locations: Locations, params: MicrobatchParams) -> SparkJob:
    """The micro-batch run's job; its driver compiles with C1 only when what landed since
    the last run is small (:func:`sessionlake.spark.quick_start_for`), as most scheduled
    runs' input is. The run's batch size comes from the environment, as the run's own
    settings do (``SESSIONLAKE_MAX_FILES_PER_TRIGGER``). The same look at the landing
    folder says when read files pile up there
    (:func:`sessionlake.archive.warn_of_read_files_left`)."""
    source = _need_source(locations)
    unread = unread_input(source, locations.checkpoint)
    warn_of_read_files_left(unread, source)
    files_per_batch = settings_from({"lake": locations.lake}).max_files_per_trigger
    return spark_job(microbatch_args(locations, params),
                     quick_start=quick_start_for(unread, files_per_batch))


# --- restart ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamPosition:
    """The stream of a checkpoint and the last batch it committed (``-1``: none yet)."""

    stream_id: str | None
    last_batch_id: int

    def as_xcom(self) -> dict[str, Any]:
        """Its fields, for a task's XCom (:func:`resumed_run` reads them back)."""
        return {"stream_id": self.stream_id, "last_batch_id": self.last_batch_id}


def _local(location: str) -> Path:
    if location.startswith("file:"):
        return Path(location.removeprefix("file:").replace("///", "/", 1))
    if "://" in location:
        raise ValueError(f"restart needs a local checkpoint and lake, got {location}")
    return Path(location)


def stream_holding(checkpoint: str) -> Holder | None:
    """The sessionlake run holding ``checkpoint``: a continuous run (the restart DAG's) or
    a run from the command line. ``None`` when none does, and for a checkpoint on object
    storage, where there is no lock to ask."""
    return running_holder(checkpoint) if local_path(checkpoint) is not None else None


def microbatch_skip_reason(locations: Locations) -> str | None:
    """Why a micro-batch DAG run has nothing to do: the restart DAG's continuous run holds
    the checkpoint and reads the landing folder itself (the job would be refused, and the
    DAG run would fail every five minutes). ``None``: go on, also once a run of this host
    that ends by itself (:func:`ends_by_itself`: a backlog run from the command line, say)
    has let go of the checkpoint, waited for up to ``SESSIONLAKE_RESTART_TIMEOUT``.

    :raises ValueError: when another run holds it (one from the command line, or one left
        over by a task that was killed): skipped, the DAG would stay green for as long as
        that run hangs, and nothing would read the landing folder.
    """
    holder = stream_holding(locations.checkpoint)
    if holder is not None and _restart_dag_args(locations.checkpoint, holder) is None:
        holder = wait_for_run_to_end(locations.checkpoint, holder, restart_timeout())
    if holder is None:
        return None
    if _restart_dag_args(locations.checkpoint, holder) is None:
        stuck = (f"`kill -TERM {holder.pid}` stops it after its batch in flight; a run "
                 "meant to go on is better started by the sessionlake_restart DAG, beside "
                 "which these runs are skipped")
        if ends_by_itself(holder):
            raise ValueError(
                f"sessionlake {holder} still holds checkpoint {locations.checkpoint} after "
                f"{format_duration(timedelta(seconds=restart_timeout()))} "
                "(SESSIONLAKE_RESTART_TIMEOUT): no micro-batch can run until it ends. It is "
                "no continuous run: it ends once it has read its input. If it hangs, "
                + stuck)
        raise ValueError(
            f"sessionlake run {holder} holds checkpoint {locations.checkpoint}, and it is not "
            "the restart DAG's continuous run (one from the command line, or one left over): "
            "no micro-batch can run until it ends. If it is stuck, " + stuck)
    return (f"sessionlake run {holder} holds checkpoint {locations.checkpoint} and reads "
            "the landing folder itself (the restart DAG's continuous run): this run has "
            "nothing to do")


def check_restore_possible(locations: Locations, params: RestoreParams,
                           connection_master: str | None = None) -> None:
    """Refuse, before any job starts, a restore to a snapshot the lake lacks, or while a
    run that Airflow cannot start again holds the checkpoint (one from the command line,
    or one whose noted command line :func:`checked_restart_args` refuses). The restart
    DAG's continuous run is no obstacle: the restore DAG stops it first and starts it
    again after (:func:`stop_for_restore`), once it says it would start
    (:func:`check_run_would_start`). Nor is, for ``SESSIONLAKE_RESTART_TIMEOUT``, a
    run of this host that ends by itself (:func:`ends_by_itself`): it is waited for.

    :raises ValueError: naming the param and the snapshots there are, or the run and how to
        stop it.
    """
    from sessionlake.snapshots import SnapshotError, find_snapshot  # DAG files stay light

    if local_path(locations.lake) is not None:
        try:
            find_snapshot(locations.lake, params.snapshot_id)
        except SnapshotError as error:
            raise _bad("snapshot_id", params.snapshot_id, str(error)) from None
    holder = stream_holding(locations.checkpoint)
    if holder is not None and _restart_dag_args(locations.checkpoint, holder) is None:
        holder = wait_for_run_to_end(locations.checkpoint, holder, restart_timeout())
    noted = None if holder is None else _restart_dag_args(locations.checkpoint, holder)
    if noted is not None:  # it is started again after the restore: it must start
        check_run_would_start(checked_restart_args(locations, noted, connection_master))
    if holder is not None and noted is None and ends_by_itself(holder):
        raise ValueError(
            f"sessionlake {holder} still holds checkpoint {locations.checkpoint} after "
            f"{format_duration(timedelta(seconds=restart_timeout()))} "
            "(SESSIONLAKE_RESTART_TIMEOUT), and a restore needs the stream stopped. It is no "
            "continuous run: it ends once it has read its input (a micro-batch DAG run, a "
            "backlog, a maintenance command); trigger the restore again once it has, or, "
            f"if it hangs, `kill -TERM {holder.pid}` stops it after its batch in flight")
    if holder is not None and noted is None:
        raise ValueError(
            f"sessionlake run {holder} holds checkpoint {locations.checkpoint}, and a restore "
            "needs the stream stopped. It was not started by the restart DAG, so this DAG "
            f"cannot start it again: `kill -TERM {holder.pid}` stops it after its batch in "
            "flight; trigger the restore again, then start the run again as it was started")
    if holder is not None:
        refuse_signal_elsewhere(holder, locations.checkpoint)


def ends_by_itself(holder: Holder) -> bool:
    """Whether the process holding a checkpoint ends without being stopped: a sessionlake
    process of this host whose command line asks for no continuous run (an available-now
    run, such as the micro-batch DAG's; a snapshot, a restore). Unknown, it does not."""
    if not holder.here or holder.pid is None:
        return False
    try:
        args = Path(f"/proc/{holder.pid}/cmdline").read_bytes().decode(
            errors="replace").split("\0")
    except OSError:
        return False
    return any("sessionlake" in arg for arg in args) and not asks_continuous(args)


def asks_continuous(args: Sequence[str]) -> bool:
    """Whether a command line asks for ``--trigger continuous``, as the command line's
    parser reads it: ``--trigger=continuous``, or any prefix of the flag it takes
    (``--trig continuous``); not another flag's value (``--name continuous``)."""
    def is_trigger(flag: str) -> bool:
        return len(flag) > 2 and "--trigger".startswith(flag)

    return any((is_trigger(arg.partition("=")[0]) and arg.partition("=")[2] == "continuous")
               or (arg == "continuous" and index > 0 and is_trigger(args[index - 1]))
               for index, arg in enumerate(args))


def wait_for_run_to_end(checkpoint: str, holder: Holder, timeout: float) -> Holder | None:
    """Wait, up to ``timeout`` seconds, while a run that ends by itself
    (:func:`ends_by_itself`) holds the checkpoint: a restore triggered beside a scheduled
    micro-batch waits for its batch instead of failing, and so does a micro-batch DAG run
    beside a backlog run from the command line. The holder then; ``None`` once the
    checkpoint is free."""
    deadline = time.monotonic() + timeout
    current: Holder | None = holder
    if ends_by_itself(holder):
        log.info("sessionlake %s holds checkpoint %s and ends by itself: waiting up to %.0f s",
                 holder, checkpoint, timeout)
    while current is not None and ends_by_itself(current) and time.monotonic() < deadline:
        time.sleep(0.5)
        current = stream_holding(checkpoint)
    return current


def checked_restart_args(locations: Locations, args: Sequence[str],
                         connection_master: str | None) -> list[str]:
    """The continuous run's command line noted in the checkpoint, to start it again after
    a restore, once it is one the restart DAG writes for these locations at a parallelism
    and a master it accepts (:func:`validate_restart_params`). The note lies in the
    checkpoint folder, which whoever writes the lake's volume can write: it must not choose
    what the restore DAG starts (another master, other files to read).

    :raises ValueError: when it is not.
    """
    noted = [str(arg) for arg in args]
    try:
        params = validate_restart_params({
            "shuffle_partitions": noted[noted.index("--shuffle-partitions") + 1],
            "master": noted[noted.index("--master") + 1]}, connection_master)
        expected = continuous_run_args(locations, params)
    except (ValueError, IndexError):
        expected = None
    if noted != expected:
        raise ValueError(
            f"the continuous run's command line noted in {locations.checkpoint}/"
            f"{CONTINUOUS_RUN} is not one the restart DAG starts for this lake, so the "
            "restore DAG will not start it: start the stream with the restart DAG")
    return noted


def _restart_dag_args(checkpoint: str, holder: Holder) -> list[str] | None:
    """The command line :func:`start_continuous_run` noted for ``holder``; ``None`` when it
    noted none, or another process's (another pid, or the same pid on another host)."""
    record = _local(checkpoint) / CONTINUOUS_RUN
    started = json.loads(record.read_text()) if record.exists() else {}
    host = socket.gethostname() if holder.here else holder.host
    if started.get("pid") != holder.pid or started.get("host", host) != host:
        return None
    return [str(arg) for arg in started["args"]]


def refuse_signal_elsewhere(holder: Holder, checkpoint: str) -> None:
    """Refuse to signal a run of another host or container sharing the checkpoint's
    volume: its pid here is another process, or none.

    :raises ValueError: naming where the run is and how to stop it there.
    """
    if not holder.here:
        raise ValueError(
            f"sessionlake run {holder} holds checkpoint {checkpoint}, and no process of this "
            f"host ({socket.gethostname()}) and container does: a signal from here would "
            f"reach another process, or none. Stop it where it runs (`kill -TERM "
            f"{'PID' if holder.pid is None else holder.pid}` on {holder.host or 'its host'}),"
            " then trigger this DAG again")


def stop_for_restore(checkpoint: str, timeout: float | None = None) -> list[str] | None:
    """Stop the restart DAG's continuous run before a restore (:func:`stop_continuous_run`).

    :return: its command line, to start it again after the restore; ``None`` when no run
        held the checkpoint.
    :raises ValueError: when a run the restart DAG did not start holds it (it started
        since :func:`check_restore_possible`).
    """
    holder = stream_holding(checkpoint)
    if holder is None:
        return None
    args = _restart_dag_args(checkpoint, holder)
    if args is None:
        raise ValueError(f"sessionlake run {holder}, not the restart DAG's, holds "
                         f"checkpoint {checkpoint}: stop it (`kill -TERM {holder.pid}`), "
                         "then trigger the restore again")
    stop_continuous_run(checkpoint, timeout)
    return args


def running_holder(checkpoint: str) -> Holder | None:
    """The run holding the checkpoint's lock, or ``None`` when it is free."""
    folder = _local(checkpoint)
    return checkpoint_holder(folder) if lock_held(folder) else None


def running_pid(checkpoint: str) -> int | None:
    """The pid of the run holding the checkpoint's lock, ``None`` when it is free or held
    by a process of another host or container, whose pid means nothing here."""
    holder = running_holder(checkpoint)
    return holder.pid if holder is not None and holder.here else None


def stop_continuous_run(checkpoint: str, timeout: float | None = None) -> int | None:
    """SIGTERM the run holding the checkpoint and wait until it has let go of it.

    The run stops gracefully: the micro-batch in flight finishes and commits first.

    :return: the pid that was stopped, or ``None`` when no run held the checkpoint.
    :raises ValueError: when the run is one of another host or container
        (:func:`refuse_signal_elsewhere`).
    :raises TimeoutError: when it still holds the checkpoint after ``timeout`` seconds
        (default :func:`restart_timeout`).
    """
    timeout = restart_timeout() if timeout is None else timeout
    holder = running_holder(checkpoint)
    if holder is not None and holder.here and not _is_sessionlake(holder.pid):
        time.sleep(0.2)  # perhaps a reader's probe of a lock just let go (the health page)
        holder = running_holder(checkpoint)
        if holder is not None and holder.here and not _is_sessionlake(holder.pid):
            raise ValueError(f"pid {holder.pid} holds the lock of checkpoint {checkpoint} "
                             "and is no sessionlake process: not signalled; trigger again")
    if holder is None:
        return None
    refuse_signal_elsewhere(holder, checkpoint)
    pid = holder.pid
    assert pid is not None  # a holder here is named by the kernel, or by its pid file
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while lock_held(_local(checkpoint)):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"sessionlake run pid {pid} still holds {checkpoint} {timeout:.0f}s after "
                "SIGTERM: check its batch, or stop it at once (a second SIGTERM cancels "
                "the batch, which replays on restart) and restart"
            )
        time.sleep(1)
    return pid


def _is_sessionlake(pid: int | None) -> bool:
    """Whether process ``pid`` runs sessionlake (its command line names it: ``sessionlake
    run``, ``python -m sessionlake.cli``, a spark-submit of ``sessionlake_job.py``); also
    when that cannot be read (no ``/proc``)."""
    try:
        return b"sessionlake" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False  # gone
    except OSError:
        return True


def stop_restart_dag_run(checkpoint: str | None = None,
                         timeout: float | None = None) -> int | None:
    """Stop the continuous run the restart DAG started here, when it still holds the
    checkpoint (:func:`stop_continuous_run`): its micro-batch in flight commits first.

    For the end of the scheduler's container (``docker/entrypoint.sh``): the run is in a
    session of its own (:func:`start_continuous_run`), so the SIGTERM that stops the
    scheduler does not reach it. A run the restart DAG did not start is left alone, and
    so is one of another container (:func:`refuse_signal_elsewhere`).

    :param checkpoint: default the workers' (:func:`locations_from_env`).
    :return: the pid that was stopped, or ``None``.
    :raises TimeoutError: when it still holds the checkpoint after ``timeout`` seconds
        (default :func:`restart_timeout`).
    """
    checkpoint = checkpoint or locations_from_env().checkpoint
    holder = running_holder(checkpoint)
    if holder is None or not holder.here or _restart_dag_args(checkpoint, holder) is None:
        return None
    return stop_continuous_run(checkpoint, timeout)


def stream_position(lake: str, checkpoint: str) -> StreamPosition:
    """The checkpoint's stream id and the last batch id it committed to ``batch_metrics``.

    Read without Spark: each ``batch_metrics`` append carries the batch's tag (app id
    ``sessionlake-<stream_id>-e<epoch>`` and batch id) in its commit file. Only the current
    epoch counts: after a restore, batch ids start again from the snapshot's, below those
    the stream had reached before. A stream's batches commit in order, so the log is read
    from its newest commit back to the first with that tag, not whole (a month of
    one-minute batches keeps some 43,000 commits, and the restart and restore DAGs ask
    every two seconds while they wait for the stream).
    """
    identity = read_stream_identity(None, str(_local(checkpoint)))
    log = _local(lake) / "batch_metrics" / "_delta_log"
    if identity is not None and log.is_dir():
        for commit in sorted(log.glob("*.json"), reverse=True):  # names sort by version
            batches = [batch for app, batch in batch_keys(commit_actions(commit.read_text()))
                       if app == identity.app_id]
            if batches:
                return StreamPosition(identity.stream_id, max(batches))
    return StreamPosition(None if identity is None else identity.stream_id, -1)


def start_continuous_run(args: Sequence[str], checkpoint: str) -> int:
    """Start ``sessionlake <args>`` detached, its output in the checkpoint folder, and note
    its pid and command line there (:data:`CONTINUOUS_RUN`).

    :return: the new process's pid.
    """
    folder = _local(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / CONTINUOUS_LOG, "ab") as log:
        process = subprocess.Popen(_sessionlake_command(args), stdout=log,
                                   stderr=subprocess.STDOUT, env=child_env(),
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    (folder / CONTINUOUS_RUN).write_text(json.dumps(
        {"pid": process.pid, "host": socket.gethostname(), "args": list(args)}))
    return process.pid


def _sessionlake_command(args: Sequence[str]) -> list[str]:
    """``sessionlake <args>`` as the DAGs start it themselves (the project's console
    script, beside its interpreter)."""
    return [str(Path(python_executable()).parent / "sessionlake"), *args]


def check_run_would_start(args: Sequence[str]) -> None:
    """Ask the continuous run ``args`` whether it would start (``sessionlake run
    --check-only``, as :func:`start_continuous_run` would start it, with its environment),
    beside the run the restart DAG is to stop: a refusal found only after the stop left
    the stream stopped (the Airflow review: a worker's ``SESSIONLAKE_FORMAT`` other than
    the stream's). Starts a Spark driver for the checks, as the run would.

    :raises ValueError: with the run's refusal, and the workers' variables behind the
        flags it names (the run takes them from there, not from the DAG's params).
    """
    # Its checks read the lake and the checkpoint from the driver: a local driver asks them
    # (a cluster's cores may all be the running stream's; its master was asked already).
    done = subprocess.run(_sessionlake_command([*args, "--check-only", "--master", "local[1]"]),
                          env=child_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False)
    if done.returncode == 0:
        return
    errors = [line.removeprefix("sessionlake: error: ") for line in done.stderr.splitlines()
              if line.startswith("sessionlake: error: ")]
    why = errors[-1] if errors else (done.stderr.strip()[-2000:] or
                                     f"exit status {done.returncode}")
    from sessionlake.cli import option_variables  # DAG files stay light

    of_flag = option_variables("run")
    variables = [of_flag[flag] for flag in dict.fromkeys(re.findall(r"--[a-z][a-z-]*", why))
                 if flag in of_flag and flag not in ("--shuffle-partitions", "--master")]
    where = (f" (the DAG's run takes {', '.join(variables)} from the Airflow workers' "
             "environment)") if variables else ""
    raise ValueError(f"the restarted run would be refused, so nothing was stopped: "
                     f"{why}{where}")


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def started_run(where: Locations, args: Sequence[str]) -> dict[str, Any]:
    """The restart and restore DAGs' start step: the stream's position, read just before
    the continuous run ``args`` starts detached, and the run's pid, as the task's XCom that
    :func:`resumed_run` waits on. Read here rather than when the old run stopped: a
    micro-batch DAG run may commit a batch in between."""
    before = stream_position(where.lake, where.checkpoint)
    return {"pid": start_continuous_run(args, where.checkpoint), **before.as_xcom()}


def resumed_run(before: Mapping[str, Any], pid: int) -> dict[str, Any]:
    """The restart and restore DAGs' last step: wait (``SESSIONLAKE_RESTART_TIMEOUT``) for
    the run ``pid`` to commit a batch of the stream ``before`` names (a task's XCom holding
    a :class:`StreamPosition`'s fields) after its ``last_batch_id``.

    :return: the run's pid and the stream's new position, as the task's XCom.
    """
    where = locations_from_env()
    now = wait_for_resumed_stream(
        where.lake, where.checkpoint,
        StreamPosition(before["stream_id"], int(before["last_batch_id"])), pid,
        restart_timeout())
    return {"pid": pid, **now.as_xcom()}


def wait_for_resumed_stream(
    lake: str, checkpoint: str, before: StreamPosition, pid: int, timeout: float | None = None
) -> StreamPosition:
    """Wait until the new run ``pid`` has committed a batch after ``before``, on the same
    stream.

    A batch counts only while ``pid`` holds the checkpoint: a micro-batch DAG run may take
    the checkpoint between two of the restart DAG's tasks (the pool queues tasks, not the
    DAG run), and its commit is no proof that the new run started, let alone resumed.
    ``before`` is the position the caller read just before starting ``pid``.

    :raises RuntimeError: when the run exited, or started a stream other than ``before``'s.
    :raises TimeoutError: when no new batch was committed within ``timeout`` seconds
        (default :func:`restart_timeout`).
    """
    timeout = restart_timeout() if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        holder = running_pid(checkpoint)  # read first: a batch read after is the holder's
        now = stream_position(lake, checkpoint)
        if before.stream_id is not None and now.stream_id not in (None, before.stream_id):
            raise RuntimeError(
                f"the checkpoint's stream changed from {before.stream_id} to {now.stream_id}: "
                "the new run did not resume from the checkpoint"
            )
        if (holder == pid and now.stream_id is not None
                and now.last_batch_id > before.last_batch_id):
            return now
        if not _alive(pid):
            tail = (_local(checkpoint) / CONTINUOUS_LOG).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the new sessionlake run (pid {pid}) exited:\n{tail}")
        if time.monotonic() > deadline:
            after = "" if before.last_batch_id < 0 else f" after batch {before.last_batch_id}"
            raise TimeoutError(
                f"the new run (pid {pid}) has committed no batch{after} within "
                f"{timeout:.0f}s (SESSIONLAKE_RESTART_TIMEOUT): is data arriving? The run "
                "goes on, and may commit once data comes or its first batch ends (its log: "
                f"{_local(checkpoint) / CONTINUOUS_LOG}); this failure stops nothing"
            )
        time.sleep(2)
