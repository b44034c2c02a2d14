#!/usr/bin/env python3
"""Runs offload-bench --workload=collective under strata-run (small: sizes 4 KiB and 16 KiB,
--bytes=16KiB per sample, --repeat=2) with --json=- and checks the document: the top-level fields
every workload writes, the "collective" object (backend gloo, ranks), one row per operation and
size in order with every field, positive times and bandwidths, busbw = algbw x nccl-tests' bus
factor and ratio = baseline time / strata time. Only rank 0 writes: stdout is exactly one JSON
document.

  check_collective_json.py STRATA_RUN BENCH RANKS   under strata-run -n RANKS
  check_collective_json.py - BENCH 1                 alone (no launcher): one rank, whose
                                                     all_gather, reduce_scatter and all_reduce
                                                     move nothing (bus bandwidth 0)

No timing assertions: the machine may be busy."""
import json
import math
import subprocess
import sys

from bench_common import CONFIG_FIELDS

OPS = ["all_gather", "reduce_scatter", "all_reduce", "broadcast"]
SIZES = [4096, 16384]
REPEAT = 2
ROW_FIELDS = {"op", "bytes", "calls_per_sample", "time_s", "algbw_gbps", "busbw_gbps",
              "baseline_time_s", "baseline_algbw_gbps", "baseline_busbw_gbps", "ratio",
              "samples_s", "baseline_samples_s"}
COLLECTIVE_FIELDS = {"backend", "ranks", "description", "baseline", "repeat", "warmups", "time",
                     "rows"}


def bus_factor(op, n):
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1
    return (n - 1) / n


def close(a, b):
    """The JSON keeps 6 significant digits."""
    return math.isclose(a, b, rel_tol=1e-4)


def main() -> int:
    strata_run, bench, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    launcher = [] if strata_run == "-" else [strata_run, "-n", str(ranks)]
    args = [*launcher, bench, "--workload=collective", "--bytes=16KiB", "--tensor-bytes=4KiB,16KiB",
            f"--repeat={REPEAT}", "--json=-"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=240)
    if run.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {run.returncode}:\n{run.stderr}")
    doc = json.loads(run.stdout)  # fails if another rank also wrote to stdout
    missing = {"version", "backend", "device", "config", "results", "collective"} - doc.keys()
    assert not missing, f"top-level fields missing: {missing}"
    missing = CONFIG_FIELDS - doc["config"].keys()
    assert not missing, f"config fields missing: {missing}"
    assert doc["results"] == [], doc["results"]
    coll = doc["collective"]
    missing = COLLECTIVE_FIELDS - coll.keys()
    assert not missing, f"collective fields missing: {missing}"
    assert coll["backend"] == "gloo" and coll["ranks"] == ranks, coll
    assert coll["repeat"] == REPEAT, coll
    # Sizes are rounded down to whole float32 shards: a multiple of 4 x ranks.
    unit = 4 * ranks
    sizes = [s // unit * unit for s in SIZES]
    got = [(row["op"], row["bytes"]) for row in coll["rows"]]
    assert got == [(op, size) for op in OPS for size in sizes], got
    for row in coll["rows"]:
        where = f"{row.get('op')} {row.get('bytes')}"
        missing = ROW_FIELDS - row.keys()
        assert not missing, f"{where}: fields missing: {missing}"
        assert row["calls_per_sample"] == max(1, 16384 // row["bytes"]), row
        assert len(row["samples_s"]) == REPEAT and len(row["baseline_samples_s"]) == REPEAT, row
        assert all(t > 0 for t in row["samples_s"] + row["baseline_samples_s"]), row
        assert row["time_s"] > 0 and row["baseline_time_s"] > 0, row
        assert close(row["time_s"], sum(row["samples_s"]) / REPEAT), row  # median of two
        assert row["algbw_gbps"] > 0 and row["baseline_algbw_gbps"] > 0, row
        if bus_factor(row["op"], ranks) > 0:
            assert row["busbw_gbps"] > 0 and row["baseline_busbw_gbps"] > 0, row
        else:
            assert row["busbw_gbps"] == 0 and row["baseline_busbw_gbps"] == 0, row
        assert close(row["algbw_gbps"], row["bytes"] / 1e9 / row["time_s"]), row
        factor = bus_factor(row["op"], ranks)
        assert close(row["busbw_gbps"], row["algbw_gbps"] * factor), row
        assert close(row["baseline_busbw_gbps"], row["baseline_algbw_gbps"] * factor), row
        assert close(row["ratio"], row["baseline_time_s"] / row["time_s"]), row
        assert close(row["ratio"], row["algbw_gbps"] / row["baseline_algbw_gbps"]), row
    table = [line for line in run.stderr.splitlines() if line.split()[:1] and
             line.split()[0] in OPS]
    assert len(table) == len(OPS) * len(sizes), run.stderr  # one table line per row, rank 0 only
    print(f"collective: {len(coll['rows'])} rows over {ranks} ranks checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
