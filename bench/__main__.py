"""sessionlake against Spark's own streaming session_window, on the same generated files.

    .venv/bin/python -m bench [--events 1000000] [--users 100000] [--files 10] [--out DIR]

Every system runs as its own process and is timed whole (JVM start included), as an
operator would see it. Prints a table, then one JSON object with the figures and the
ratios (sessionlake / peer) as the last line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def timed(command: list[str]) -> float:
    """Run ``command`` to completion; its wall time in seconds."""
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    return time.monotonic() - started


def sessionlake_run(source: Path, lake: Path, *flags: str) -> float:
    """Wall time of one ``sessionlake run`` (available-now) over ``source``."""
    return timed([PY, "-m", "sessionlake.cli", "run", "--source", str(source),
                  "--lake", str(lake), *flags])


def peer_run(source: Path, out: Path, files_per_trigger: int | None = None) -> float:
    """Wall time of the peer job (session_window + RocksDB) over ``source``."""
    command = [PY, "-m", "bench.peer_session_window", str(source), str(out / "sessions"),
               str(out / "checkpoint")]
    if files_per_trigger:
        command.append(str(files_per_trigger))
    return timed(command)


def query(lake: Path, statement: str) -> list[dict[str, Any]]:
    """Rows of a Delta SQL query over a sessionlake lake."""
    done = subprocess.run(
        [PY, "-m", "sessionlake.cli", "sql", "--lake", str(lake), "--output", "json", statement],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def compare_closed_sessions(lake: Path, peer: Path) -> dict[str, Any]:
    """Closed sessions of both systems, where their semantics agree (no late events)."""
    statement = (
        "SELECT count(*) AS n, sum(event_count) AS events, "
        "sum(hash(user_id, session_start, session_end, event_count)) AS digest FROM sessions"
    )
    ours = query(lake, statement)[0]
    code = (
        "import json,sys\n"
        "from sessionlake.spark import build_spark\n"
        "s = build_spark('local[2]')\n"
        f"d = s.read.format('delta').load({str(peer / 'sessions')!r})\n"
        "d.createOrReplaceTempView('sessions')\n"
        f"print(json.dumps(s.sql({statement!r}).head().asDict()))\n"
    )
    done = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True,
                          check=True)
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    return {"sessionlake": ours, "peer": theirs, "equal": ours == theirs}


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print the table and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "work")
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    source = args.out / "landing"
    subprocess.run([PY, "-m", "sessionlake.cli", "generate", "--out", str(source),
                    "--users", str(args.users), "--events", str(args.events),
                    "--files", str(args.files)], cwd=REPO, check=True)

    figures: dict[str, Any] = {"events": args.events, "users": args.users, "files": args.files}
    figures["sessionlake_one_batch_s"] = sessionlake_run(source, args.out / "one")
    figures["peer_one_batch_s"] = peer_run(source, args.out / "peer-one")
    figures["sessionlake_ten_batches_s"] = sessionlake_run(
        source, args.out / "ten", "--max-files-per-trigger", str(max(1, args.files // 10)))
    figures["peer_ten_batches_s"] = peer_run(source, args.out / "peer-ten",
                                             max(1, args.files // 10))
    figures["equal_closed_sessions"] = compare_closed_sessions(args.out / "one",
                                                               args.out / "peer-one")
    merge = query(args.out / "ten", (
        "SELECT sum(merge_rows_inserted + merge_rows_updated + merge_rows_deleted) AS changed, "
        "sum(merge_rows_copied) AS copied, sum(merge_files_added) AS files_added, "
        "sum(merge_files_removed) AS files_removed FROM batch_metrics"))[0]
    figures["merge"] = merge
    growing = args.out / "growing"
    figures["growing_state_run_s"] = sessionlake_run(
        source, growing, "--max-files-per-trigger", "1", "--gap", "3d",
        "--max-session-duration", "3d")
    figures["growing_state_batches"] = query(growing, (
        "SELECT batch_id, duration_ms, open_sessions FROM batch_metrics ORDER BY batch_id"))
    figures["ratio_one_batch"] = figures["sessionlake_one_batch_s"] / figures["peer_one_batch_s"]
    figures["ratio_ten_batches"] = (figures["sessionlake_ten_batches_s"]
                                    / figures["peer_ten_batches_s"])
    durations = [b["duration_ms"] for b in figures["growing_state_batches"]]
    if len(durations) >= 6:
        figures["growing_last3_over_first3"] = sum(durations[-3:]) / sum(durations[:3])

    print(f"{'measurement':<44}{'sessionlake':>14}{'peer':>10}{'ratio':>8}")
    for label, ours, theirs in (
        ("whole process, 1 batch (s)", figures["sessionlake_one_batch_s"],
         figures["peer_one_batch_s"]),
        (f"whole process, {args.files // max(1, args.files // 10)} batches (s)",
         figures["sessionlake_ten_batches_s"], figures["peer_ten_batches_s"]),
    ):
        print(f"{label:<44}{ours:>14.1f}{theirs:>10.1f}{ours / theirs:>8.2f}")
    print(f"closed sessions equal: {figures['equal_closed_sessions']['equal']}")
    print(f"MERGE rows changed {merge['changed']}, rows copied {merge['copied']}, "
          f"files added {merge['files_added']}, removed {merge['files_removed']}")
    for batch in figures["growing_state_batches"]:
        print(f"growing state: batch {batch['batch_id']}: {batch['duration_ms']} ms "
              f"with {batch['open_sessions']} open sessions")
    print(json.dumps(figures, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
