"""sessionlake against Spark's own streaming session_window and a plain batch job.

    .venv/bin/python -m bench [--events 1000000] [--users 100000] [--files 10]
        [--restart-sizes 10000,100000,1000000] [--out DIR]

Every system runs as its own process and is timed whole (JVM start included), as an
operator would see it (see bench/processes.py). Prints a table, then one JSON object with
the figures and the ratios (sessionlake / peer, sessionlake / plain batch) as the last line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.processes import (
    PY,
    REPO,
    peer_run,
    plain_batch_run,
    query,
    query_delta,
    sessionlake_run,
)
from bench.restart import mean_restart, measure_restart, restart_order

#: An order-independent fingerprint of a set of sessions, for the equality checks.
DIGEST = ("count(*) AS n, sum(event_count) AS events, "
          "sum(hash(user_id, session_start, session_end, event_count)) AS digest")


def compare_sessions(lake: Path, peer: Path, plain: Path) -> dict[str, Any]:
    """Where the systems' semantics agree (no late events), their sessions must be equal.

    The peer emits closed sessions only: they are compared with sessionlake's ``sessions``.
    The plain batch sessionizes every event: it is compared with ``sessions`` and
    ``open_sessions`` together.
    """
    ours = query(lake, (
        f"SELECT * FROM (SELECT {DIGEST} FROM sessions) CROSS JOIN "
        f"(SELECT {DIGEST.replace(' AS ', ' AS all_')} FROM (SELECT user_id, session_start, "
        "session_end, event_count FROM sessions UNION ALL SELECT user_id, session_start, "
        "session_end, event_count FROM open_sessions))"))[0]
    theirs = query_delta({"peer": peer / "sessions", "plain": plain}, (
        f"SELECT * FROM (SELECT {DIGEST} FROM peer) CROSS JOIN "
        f"(SELECT {DIGEST.replace(' AS ', ' AS all_')} FROM plain)"))
    closed = {k: ours[k] for k in ("n", "events", "digest")}
    every = {k: ours[f"all_{k}"] for k in ("n", "events", "digest")}
    peer_closed = {k: theirs[k] for k in ("n", "events", "digest")}
    plain_every = {k: theirs[f"all_{k}"] for k in ("n", "events", "digest")}
    return {"closed_sessionlake": closed, "closed_peer": peer_closed,
            "closed_equal": closed == peer_closed, "all_sessionlake": every,
            "all_plain_batch": plain_every, "all_equal": every == plain_every}


def print_table(figures: dict[str, Any], batches: int) -> None:
    """The human-readable summary; the JSON line after it holds every figure."""
    rows = [
        ("whole process, 1 batch, vs peer (s)", "sessionlake_one_batch_s", "peer_one_batch_s"),
        (f"whole process, {batches} batches, vs peer (s)", "sessionlake_ten_batches_s",
         "peer_ten_batches_s"),
        ("whole process, 1 batch, vs plain batch (s)", "sessionlake_one_batch_s",
         "plain_batch_s"),
    ]
    print(f"{'measurement':<52}{'sessionlake':>12}{'other':>10}{'ratio':>8}")
    for label, ours, theirs in rows:
        a, b = figures[ours], figures[theirs]
        print(f"{label:<52}{a:>12.1f}{b:>10.1f}{a / b:>8.2f}")
    for r in figures["restart"]:
        for what, key in (("to 1st commit", "first_commit_s"), ("whole process", "process_s")):
            a, b = r[f"sessionlake_{key}"], r[f"peer_{key}"]
            label = f"restart, {r['size']:,} open, {what}, vs peer (s)"
            print(f"{label:<52}{a:>12.1f}{b:>10.1f}{a / b:>8.2f}")
    equal = figures["equal_sessions"]
    print(f"closed sessions equal to the peer's: {equal['closed_equal']}; all sessions equal "
          f"to the plain batch's: {equal['all_equal']}")
    merge = figures["merge"]
    print(f"MERGE rows changed {merge['changed']}, rows copied {merge['copied']}, "
          f"files added {merge['files_added']}, removed {merge['files_removed']}")
    for batch in figures["growing_state_batches"]:
        print(f"growing state: batch {batch['batch_id']}: {batch['duration_ms']} ms "
              f"with {batch['open_sessions']} open sessions")
    for r in figures["restart"]:
        alone = ", ".join(f"{b['duration_ms']} ms" for b in r["sessionlake_batches"])
        print(f"restart, {r['size']:,} (mean of {r['runs']}): sessionlake's batch alone "
              f"{alone}, {r['sessionlake_batches'][0]['open_sessions']} open sessions; "
              f"peer state rows {r['peer_state_rows']}")


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and print the table and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--restart-sizes", default="10000,100000,1000000",
                        help="open sessions before each restart measurement, comma-separated")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "work")
    args = parser.parse_args(argv)
    sizes = sorted(int(size) for size in args.restart_sizes.split(",") if size.strip())
    shutil.rmtree(args.out, ignore_errors=True)
    source = args.out / "landing"
    subprocess.run([PY, "-m", "sessionlake.cli", "generate", "--out", str(source),
                    "--users", str(args.users), "--events", str(args.events),
                    "--files", str(args.files), "--late-fraction", "0",
                    "--duplicate-fraction", "0", "--malformed-fraction", "0"],
                   cwd=REPO, check=True)

    per_trigger = max(1, args.files // 10)
    figures: dict[str, Any] = {"events": args.events, "users": args.users, "files": args.files}
    figures["sessionlake_one_batch_s"] = sessionlake_run(source, args.out / "one").seconds
    figures["peer_one_batch_s"] = peer_run(source, args.out / "peer-one").seconds
    figures["plain_batch_s"] = plain_batch_run(source, args.out / "plain").seconds
    figures["sessionlake_ten_batches_s"] = sessionlake_run(
        source, args.out / "ten", "--max-files-per-trigger", str(per_trigger)).seconds
    figures["peer_ten_batches_s"] = peer_run(
        source, args.out / "peer-ten", "--max-files-per-trigger", str(per_trigger)).seconds
    figures["equal_sessions"] = compare_sessions(args.out / "one", args.out / "peer-one",
                                                 args.out / "plain")
    figures["merge"] = query(args.out / "ten", (
        "SELECT sum(merge_rows_inserted + merge_rows_updated + merge_rows_deleted) AS changed, "
        "sum(merge_rows_copied) AS copied, sum(merge_files_added) AS files_added, "
        "sum(merge_files_removed) AS files_removed FROM batch_metrics"))[0]
    growing = args.out / "growing"
    figures["growing_state_run_s"] = sessionlake_run(
        source, growing, "--max-files-per-trigger", "1", "--gap", "3d",
        "--max-session-duration", "3d").seconds
    figures["growing_state_batches"] = query(growing, (
        "SELECT batch_id, duration_ms, open_sessions FROM batch_metrics ORDER BY batch_id"))
    runs = [measure_restart(size, args.out / f"restart-{size}-{place}")
            for place, size in enumerate(restart_order(sizes))]
    figures["restart_runs"] = runs
    figures["restart"] = [mean_restart([run for run in runs if run["size"] == size])
                          for size in sizes]

    figures["ratio_one_batch"] = figures["sessionlake_one_batch_s"] / figures["peer_one_batch_s"]
    figures["ratio_ten_batches"] = (figures["sessionlake_ten_batches_s"]
                                    / figures["peer_ten_batches_s"])
    figures["ratio_one_batch_vs_plain"] = (figures["sessionlake_one_batch_s"]
                                           / figures["plain_batch_s"])
    figures["ratio_ten_batches_vs_plain"] = (figures["sessionlake_ten_batches_s"]
                                             / figures["plain_batch_s"])
    durations = [b["duration_ms"] for b in figures["growing_state_batches"]]
    if len(durations) >= 6:
        figures["growing_last3_over_first3"] = sum(durations[-3:]) / sum(durations[:3])
    if len(sizes) >= 2:
        first, last = figures["restart"][0], figures["restart"][-1]
        for name in ("sessionlake", "peer"):
            figures[f"{name}_restart_largest_over_smallest"] = (
                last[f"{name}_first_commit_s"] / first[f"{name}_first_commit_s"])

    print_table(figures, args.files // per_trigger)
    print(json.dumps(figures, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
