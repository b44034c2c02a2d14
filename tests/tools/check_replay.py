#!/usr/bin/env python3
"""Runs arena-replay --json and checks fields of its report: a CTest helper.

usage: check_replay.py ARENA_REPLAY TRACE [replay flags...] -- key=value [key=value...]
"""
import json
import subprocess
import sys


def main():
    args = sys.argv[1:]
    if "--" not in args or len(args) < 3:
        sys.exit(__doc__)
    split = args.index("--")
    command = [args[0], "--json", *args[2:split], args[1]]
    expected = dict(kv.split("=", 1) for kv in args[split + 1:])
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {run.returncode}: {run.stderr}")
    report = json.loads(run.stdout)
    for key in ("events", "capacity", "peak_live_bytes", "failed", "failed_without_compaction",
                "compactions", "bytes_moved", "worst_fragmentation", "alloc_ns_p50",
                "alloc_ns_p99"):
        if key not in report:
            sys.exit(f"key '{key}' missing from the report: {run.stdout}")
    # Expected values are JSON literals: 5632, 0.5, true.
    wrong = [f"{k}: expected {v}, got {report.get(k)}" for k, v in expected.items()
             if report.get(k) != json.loads(v)]
    if wrong:
        sys.exit("\n".join(wrong) + f"\nreport: {run.stdout}")
    print(f"ok: {len(expected)} fields match")


if __name__ == "__main__":
    main()
