"""A test that hangs is reported while it hangs, not waited for in silence.

pytest's own ``faulthandler_timeout`` prints the Python threads of a test still running
after that many seconds; most of this suite's waiting happens in JVMs (the session's
Spark, the CLI runs and spark-submits it starts), so at the same moment this plugin prints
the threads of every JVM under the test process. ``pytest-timeout``'s ``timeout`` then
fails the test. Both limits are set in pyproject.toml, far above the longest test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

_stderr_fd: int | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Keep a handle on the real stderr: during a test, pytest captures file descriptor 2."""
    global _stderr_fd
    for stream in (sys.stderr, sys.__stderr__):  # pytest-xdist's worker stderr has no fd
        try:
            _stderr_fd = os.dup(stream.fileno())  # type: ignore[union-attr]
            return
        except (AttributeError, ValueError, OSError):
            continue


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(stat.parent.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _is_jvm(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


def dump_jvm_threads(nodeid: str, fd: int) -> None:
    """Print to ``fd`` the threads of every JVM under this process, named by command line."""
    jcmd = shutil.which("jcmd")
    for pid in filter(_is_jvm, descendants(os.getpid())):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[-300:]
        except OSError:
            continue
        os.write(fd, f"\n+++ {nodeid} still running: threads of JVM {pid} "
                     f"(...{command.decode(errors='replace')})\n".encode())
        if jcmd is None:
            os.write(fd, b"(no jcmd on PATH)\n")
            continue
        try:
            subprocess.run([jcmd, str(pid), "Thread.print"], stdout=fd, stderr=fd, timeout=60,
                           check=False)
        except subprocess.TimeoutExpired:
            os.write(fd, f"(jcmd {pid} did not answer within 60 s)\n".encode())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Dump the JVMs' threads when a test outlives ``faulthandler_timeout``."""
    after = float(item.config.getini("faulthandler_timeout") or 0)
    if after <= 0 or _stderr_fd is None:
        return (yield)
    timer = threading.Timer(after, dump_jvm_threads, (item.nodeid, _stderr_fd))
    timer.daemon = True
    timer.start()
    try:
        return (yield)
    finally:
        timer.cancel()
