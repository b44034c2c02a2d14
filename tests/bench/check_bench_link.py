#!/usr/bin/env python3
"""offload-bench's figures are physically possible: no path is faster than the link its baseline
measured in the same run. gpu-cpu once timed evict() calls that return before their write-backs
(the copies ran on after the pass, on the mover's stream) and printed 126-468x its baseline on the
host backend and 16,539 GB/s on an H200.

  check_bench_link.py BENCH

Runs --paths=gpu-cpu (small: 16 MiB in 1 MiB and 4 MiB tensors, 3 repetitions) and checks that it
exits 0 and that each row's median is within its link's limit, recomputed here from the
baseline's passes as the bench defines it (docs/bench.md, "The link check"): the link's fastest
pass plus the larger of 25% and the baseline's own spread (max - min) / median. No speed is
asserted.
"""
import os
import sys
import tempfile

from bench_common import check_document, run_bench

MIN_NOISE = {"gpu": 0.25, "nvme": 2.0}


def link_limit(row):
    """The link's fastest pass (rechecks included) times 1 + the larger of the link's least
    noise and the baseline's spread (max - min) / median."""
    low, mid, high = row["baseline_gbps_min"], row["baseline_gbps"], row["baseline_gbps_max"]
    assert 0 < low <= mid <= high <= row["link_gbps"] + 0.0005, row
    assert row["link_rechecks"] >= 0 and (row["link_rechecks"] > 0 or
                                          row["link_gbps"] == high), row
    return row["link_gbps"] * (1 + max(MIN_NOISE[row["link"]], (high - low) / mid))


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="offload-bench-link-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        doc = run_bench(bench, ["--paths=gpu-cpu", "--bytes=16MiB", "--tensor-bytes=1MiB,4MiB",
                                "--repeat=3"], env)
    rows = doc["results"]
    assert [(r["path"], r["tensor_bytes"]) for r in rows] == [
        ("gpu-cpu", 1 << 20), ("gpu-cpu", 4 << 20)], rows
    for row in rows:
        check_document(dict(doc, results=[row]), ["gpu-cpu"], total=16 << 20,
                       tensor=row["tensor_bytes"], repeats=3)
        limit = link_limit(row)
        # The JSON rounds to 3 decimals; the bench compared the unrounded figures.
        assert row["gbps_median"] <= limit + 0.002, (
            f"gpu-cpu at {row['tensor_bytes']} B: {row['gbps_median']} GB/s is above its link's "
            f"limit {limit:.3f} GB/s (baseline passes {row['baseline_gbps_min']}-"
            f"{row['baseline_gbps_max']} GB/s): the timing ended before the bytes moved")
        assert row["link"] == "gpu", row
        assert abs(row["link_limit_gbps"] - limit) <= 0.01 * limit, (row, limit)
    print("gpu-cpu within its link:", ", ".join(
        f"{r['tensor_bytes'] >> 20} MiB {r['gbps_median']} <= {link_limit(r):.2f} GB/s"
        for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
