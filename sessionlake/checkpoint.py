"""The files sessionlake keeps in a checkpoint folder besides Spark's, and its lock; where
the lake keeps its snapshot catalog.

Kept free of PySpark so that the Airflow DAGs and the health page can look at a checkpoint
(is a run holding it? which stream is it?) and at the snapshots without starting a JVM.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

#: The flock a run holds for its whole life; a second run on the checkpoint is refused.
LOCK_FILE = "sessionlake.lock"
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
