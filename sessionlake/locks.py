"""One stream per checkpoint and one per lake: the locks a run holds while it runs, and
that a restore, an archive, a snapshot or a rebuild of the state takes before writing.

Each is an ``flock`` on a file in the folder, with the holder (a pid, and the lake's
checkpoint) written beside it for the refusal's message; the kernel lets go when the
process dies, even by SIGKILL. Local folders only: on object stores the orchestrator, which
runs one micro-batch DAG run at a time, is the guard.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sessionlake.checkpoint import (
    LAKE_HOLDER_FILE,
    LAKE_LOCK_FILE,
    LOCK_FILE,
    LOCK_PATIENCE_S,
    PID_FILE,
    lake_lock_folder,
    lock_held,
)
from sessionlake.registry import checkpoint_key
from sessionlake.storage import local_path


class StreamAlreadyRunning(RuntimeError):
    """Another process runs a stream on the same checkpoint, or on the same lake."""


@contextmanager
def checkpoint_lock(checkpoint: str) -> Iterator[None]:
    """Hold the checkpoint's lock for one stream at a time, with our pid beside it.

    Two streams on one checkpoint would each commit the same batch ids; the second is
    refused with a message instead. (Local checkpoints only: on object stores the
    orchestrator, which runs one micro-batch DAG run at a time, is the guard.)
    """
    folder = local_path(checkpoint)
    new = folder is not None and not folder.exists()
    try:
        with _held_alone(folder, LOCK_FILE, PID_FILE, str(os.getpid()), lambda pid: (
                f"another sessionlake run (pid {pid}) is using checkpoint {checkpoint}: "
                "wait for it to finish, or stop it first")):
            yield
    finally:
        if new and folder is not None:
            _remove_if_only_lock(folder)


def _remove_if_only_lock(folder: Path) -> None:
    """Remove a new checkpoint folder that holds nothing but its lock (a run refused before
    it wrote anything), so that no empty checkpoint is left behind; kept if anything else
    is in it, or another run holds it."""
    if [p.name for p in folder.iterdir()] != [LOCK_FILE] or lock_held(folder):
        return
    (folder / LOCK_FILE).unlink(missing_ok=True)
    folder.rmdir()


@contextmanager
def lake_lock(lake: str, checkpoint: str) -> Iterator[None]:
    """Hold the lake's stream lock for one stream at a time, whatever its checkpoint.

    Two streams on one lake, on two checkpoints, would each MERGE the open sessions they
    read before the other's commit, and judge lateness each by its own watermark; the
    second is refused, naming the first's checkpoint. (Local lakes only, as above.) The
    holder file names a local checkpoint by its absolute path, so that the health page,
    in another process and folder, sizes the stream's input on it.
    """
    folder = local_path(lake_lock_folder(lake))
    holder = json.dumps({"pid": os.getpid(), "checkpoint": checkpoint_key(checkpoint)})

    def refusal(text: str) -> str:
        try:
            other = json.loads(text)
        except ValueError:
            other = {}
        return (f"another sessionlake run (pid {other.get('pid', '?')}) is writing lake {lake}"
                f" from checkpoint {other.get('checkpoint', '?')}: one stream per lake;"
                " stop it first, or run on its checkpoint")

    with _held_alone(folder, LAKE_LOCK_FILE, LAKE_HOLDER_FILE, holder, refusal):
        yield


@contextmanager
def stream_locks(lake: str, checkpoint: str) -> Iterator[None]:
    """Hold both: the checkpoint's lock, then the lake's (see above): what a run holds,
    and what a restore or a rebuild of the state needs, which no stream may write beside."""
    with checkpoint_lock(checkpoint), lake_lock(lake, checkpoint):
        yield


@contextmanager
def _held_alone(folder: Path | None, lock_file: str, holder_file: str, holder: str,
                refusal: Callable[[str], str]) -> Iterator[None]:
    """Hold the ``flock`` of ``folder/lock_file`` with ``holder`` written beside it, or
    raise :class:`StreamAlreadyRunning` with ``refusal`` of the holder's text. The kernel
    lets go when the process dies, even by SIGKILL. ``folder`` ``None``: not local, no lock.
    """
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + LOCK_PATIENCE_S
    with open(folder / lock_file, "a+") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:  # perhaps a reader's probe: try again
                    time.sleep(0.05)
                    continue
                text = (folder / holder_file).read_text().strip() if (
                    folder / holder_file).exists() else "?"
                raise StreamAlreadyRunning(refusal(text)) from None
        (folder / holder_file).write_text(holder)
        try:
            yield
        finally:
            (folder / holder_file).unlink(missing_ok=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


def checkpoint_in_use(checkpoint: str) -> bool:
    """Whether a run holds the checkpoint's lock (local checkpoints; remote: ``False``)."""
    folder = local_path(checkpoint)
    return folder is not None and lock_held(folder)


def lake_in_use(lake: str) -> bool:
    """Whether a run holds the local lake's stream lock, whatever its checkpoint (remote
    lakes: ``False``)."""
    folder = local_path(lake_lock_folder(lake))
    return folder is not None and lock_held(folder, LAKE_LOCK_FILE)
