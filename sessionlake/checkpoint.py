"""The files sessionlake keeps in a checkpoint folder besides Spark's, and its lock; where
the lake keeps its snapshot catalog.

Kept free of PySpark so that the Airflow DAGs and the health page can look at a checkpoint
(is a run holding it? which stream is it?) and at the snapshots without starting a JVM.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The flock a run holds for its whole life; a second run on the checkpoint is refused.
LOCK_FILE = "sessionlake.lock"
#: The flock a micro-batch holds from pinning the table versions it reads to its last write.
#: An erasure takes it too, so that no batch reads a user's state from before an erasure
#: and writes it back after.
BATCH_LOCK_FILE = "sessionlake-batch.lock"
#: The pid of the run holding the lock.
PID_FILE = "sessionlake.pid"
#: The stream's id and restore epoch (see ``sessionlake.batch.StreamIdentity``).
IDENTITY_FILE = "sessionlake.json"
#: Left by a restore that has not finished (see ``sessionlake.snapshots``).
RESTORING_MARKER = "sessionlake-restoring.json"
#: The lake's snapshot catalog: ``<lake>/_snapshots/<id>/snapshot.json`` (see
#: ``sessionlake.snapshots``).
SNAPSHOTS_DIR = "_snapshots"
MANIFEST = "snapshot.json"

log = logging.getLogger("sessionlake.checkpoint")


def lock_held(folder: Path) -> bool:
    """Whether a run holds the lock of the local checkpoint ``folder``."""
    if not (folder / LOCK_FILE).exists():
        return False
    with open(folder / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
    return False


class LockTimeout(TimeoutError):
    """A lock was not free within the time the caller was willing to wait."""


@contextmanager
def batch_lock(folder: Path | None, timeout: float | None = None) -> Iterator[None]:
    """Hold the batch lock of the local checkpoint ``folder`` (``None``: remote, no lock).

    Without ``timeout`` this waits as long as it takes (a batch waiting for an erasure);
    with one it raises :class:`LockTimeout` when the lock stays taken that long.
    """
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / BATCH_LOCK_FILE, "a+") as lock:
        if timeout is None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            waited = False
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited:
                        log.info("waiting up to %g s for the batch in flight on %s",
                                 timeout, folder)
                        waited = True
                    if time.monotonic() > deadline:
                        raise LockTimeout(
                            f"the batch lock of {folder} stayed taken for {timeout:g} s"
                        ) from None
                    time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
