"""One stream per checkpoint and one per lake: the locks a run holds while it runs, and
that a restore, an archive, a snapshot or a rebuild of the state takes before writing.

Each is an ``flock`` on a file in the folder, with the holder (a pid, and the lake's
checkpoint) written beside it for the refusal's message; the kernel lets go when the
process dies, even by SIGKILL. Local folders only: on object stores the orchestrator, which
runs one micro-batch DAG run at a time, is the guard.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionlake.checkpoint import (
    HOLDER_FILE,
    LAKE_HOLDER_FILE,
    LAKE_LOCK_DIR,
    LAKE_LOCK_FILE,
    LOCK_FILE,
    LOCK_PATIENCE_S,
    PID_FILE,
    lake_lock_folder,
    lock_held,
)
from sessionlake.config import ActionableError
from sessionlake.registry import checkpoint_key
from sessionlake.storage import local_path


class StreamAlreadyRunning(ActionableError, RuntimeError):
    """Another process runs a stream on the same checkpoint, or on the same lake."""


def kernel_holder(lock: Path) -> int | None:
    """The pid of the process that holds the ``flock`` of ``lock``, as the kernel tells
    it (``/proc/locks``): ``0`` when it is held by no process of this pid namespace (a run
    in another container sharing the volume, or on another host), ``None`` when the
    kernel does not say (no ``/proc``). Unlike the pid a holder writes down, which anyone
    who can write the folder can change, this is the process a signal must go to."""
    try:
        stat = lock.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    key = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in table.splitlines():
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE 6416 fe:00:9986091 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            return int(fields[4])  # waiters' lines ("1: -> FLOCK ...") do not match
    return 0


def has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` of this pid namespace has the file ``path`` open."""
    try:
        wanted = path.stat()
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # no such file or process, or not ours to look at
        return False
    for fd in descriptors:
        with contextlib.suppress(OSError):  # closed meanwhile
            opened = fd.stat()
            if (opened.st_dev, opened.st_ino) == (wanted.st_dev, wanted.st_ino):
                return True
    return False


@dataclass(frozen=True)
class Holder:
    """The process holding a checkpoint's lock."""

    #: Its pid here when ``here``; else the pid it noted, in its own namespace.
    pid: int | None
    #: Whether it is a process of this host and pid namespace (:func:`kernel_holder`),
    #: which a signal sent from here reaches.
    here: bool = True
    #: The host it noted, for a holder that is not ``here``.
    host: str | None = None

    def __str__(self) -> str:
        pid = f"pid {'?' if self.pid is None else self.pid}"
        return pid if self.here else f"{pid} on host {self.host or '?'}"


def checkpoint_holder(folder: Path) -> Holder | None:
    """The run holding the lock of the local checkpoint ``folder`` (asked while it is
    held), ``None`` when neither the kernel nor the holder's files name one. The kernel's
    word comes first; without ``/proc`` the pid file's is taken, as here."""
    text = (folder / PID_FILE).read_text().strip() if (folder / PID_FILE).exists() else ""
    noted_pid = int(text) if text.isdigit() else None
    pid = kernel_holder(folder / LOCK_FILE)
    if pid:
        return Holder(pid)
    if pid is None:
        return None if noted_pid is None else Holder(noted_pid)
    if not lock_held(folder):
        return None  # the run let go since the caller asked
    if noted_pid is not None and has_open(noted_pid, folder / LOCK_FILE):
        return Holder(noted_pid)  # a file system whose inodes /proc/locks names otherwise
    try:
        noted: dict[str, Any] = json.loads((folder / HOLDER_FILE).read_text())
    except (OSError, ValueError):
        noted = {}
    host = noted.get("host") if noted.get("pid") == noted_pid else None
    return Holder(noted_pid, here=False, host=None if host is None else str(host))


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
                f"another sessionlake run ({_holder_text(folder, pid)}) is using checkpoint "
                f"{checkpoint}: wait for it to finish, or stop it first")):
            if folder is not None:
                _note_place(folder)
            try:
                yield
            finally:
                if folder is not None:
                    (folder / HOLDER_FILE).unlink(missing_ok=True)
    finally:
        if new and folder is not None:
            _remove_if_only_lock(folder)


def _note_place(folder: Path) -> None:
    """Write this process's pid and host beside the checkpoint's lock: where to stop it,
    for whoever cannot (a task in another container, see :func:`checkpoint_holder`)."""
    (folder / HOLDER_FILE).write_text(json.dumps({"pid": os.getpid(),
                                                  "host": socket.gethostname()}))


def _holder_text(folder: Path | None, pid: str) -> str:
    """The holder named in a refusal: its pid, and its host when not this one."""
    holder = checkpoint_holder(folder) if folder is not None else None
    return str(holder) if holder is not None else f"pid {pid}"


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
    holder = json.dumps({"pid": os.getpid(), "checkpoint": checkpoint_key(checkpoint),
                         "host": socket.gethostname()})

    def refusal(text: str) -> str:
        try:
            other = json.loads(text)
        except ValueError:
            other = {}
        host = other.get("host")
        where = "" if host in (None, socket.gethostname()) else f" on host {host}"
        return (f"another sessionlake run (pid {other.get('pid', '?')}{where}) is writing "
                f"lake {lake}"
                f" from checkpoint {other.get('checkpoint', '?')}: one stream per lake;"
                " stop it first, or run on its checkpoint")

    with _held_alone(folder, LAKE_LOCK_FILE, LAKE_HOLDER_FILE, holder, refusal):
        yield


@contextmanager
def stream_locks(lake: str, checkpoint: str) -> Iterator[None]:
    """Hold both: the checkpoint's lock, then the lake's (see above): what a run holds,
    and what a restore or a rebuild of the state needs, which no stream may write beside.
    A lake folder they made is removed again if nothing but the lock came into it."""
    folder = local_path(lake)
    new = folder is not None and not folder.exists()
    try:
        with checkpoint_lock(checkpoint), lake_lock(lake, checkpoint):
            yield
    finally:
        if new and folder is not None:
            _remove_if_only_lake_lock(folder)


def _remove_if_only_lake_lock(lake: Path) -> None:
    """Remove a new lake folder that holds nothing but its stream lock (a first run refused
    before it wrote anything), so that a refusal leaves no half-made lake behind; kept if
    anything else is in it, or another run holds the lock."""
    locks = lake / LAKE_LOCK_DIR
    if ([p.name for p in lake.iterdir()] != [LAKE_LOCK_DIR]
            or [p.name for p in locks.iterdir()] != [LAKE_LOCK_FILE]
            or lock_held(locks, LAKE_LOCK_FILE)):
        return
    with contextlib.suppress(OSError):  # something came in since: keep it
        (locks / LAKE_LOCK_FILE).unlink(missing_ok=True)
        locks.rmdir()
        lake.rmdir()


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
