"""The processes the benchmark times: each system runs as its own process, timed whole.

Whole-process wall time (JVM start included) is what an operator waits for, and the same
yardstick for every system, whatever it does inside.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


@dataclass(frozen=True)
class Timing:
    """One finished process: when it started (epoch seconds), its wall time, its stdout."""

    started: float
    seconds: float
    stdout: str


def timed(command: list[str]) -> Timing:
    """Run ``command`` (cwd: the repository) to completion and time it.

    :raises SystemExit: with the tail of stderr when the process fails, so a broken run
        never yields a figure.
    """
    started, clock = time.time(), time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - clock
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return Timing(started, seconds, done.stdout)


def sessionlake_run(source: Path, lake: Path, *flags: str) -> Timing:
    """One ``sessionlake run`` (available-now) over ``source`` into ``lake``."""
    return timed([PY, "-m", "sessionlake.cli", "run", "--source", str(source),
                  "--lake", str(lake), *flags])


def peer_run(source: Path, out: Path, *flags: str) -> Timing:
    """The peer job (session_window + RocksDB) over ``source``; output and checkpoint in ``out``.

    ``flags`` go to :mod:`bench.peer_session_window` (``--max-files-per-trigger``, ``--gap``).
    """
    return timed([PY, "-m", "bench.peer_session_window", str(source), str(out / "sessions"),
                  str(out / "checkpoint"), *flags])


def plain_batch_run(source: Path, out: Path) -> Timing:
    """The plain batch sessionization (:mod:`bench.plain_batch`) of ``source`` into ``out``."""
    return timed([PY, "-m", "bench.plain_batch", str(source), str(out)])


def query(lake: Path, statement: str) -> list[dict[str, Any]]:
    """Rows of a Delta SQL query over a sessionlake lake (``sessionlake sql``)."""
    done = subprocess.run(
        [PY, "-m", "sessionlake.cli", "sql", "--lake", str(lake), "--output", "json", statement],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def query_delta(tables: dict[str, Path], statement: str) -> dict[str, Any]:
    """The first row of ``statement`` over plain Delta tables, named by ``tables``' keys.

    For the outputs of the peer and of the plain batch, which are not sessionlake lakes.
    """
    code = (
        "import json\n"
        "from sessionlake.spark import build_spark\n"
        "s = build_spark('local[2]')\n"
        f"for name, path in {({k: str(v) for k, v in tables.items()})!r}.items():\n"
        "    s.read.format('delta').load(path).createOrReplaceTempView(name)\n"
        f"print(json.dumps(s.sql({statement!r}).head().asDict()))\n"
    )
    done = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))
