#!/usr/bin/env python3
"""Runs offload-bench --workload=train-step (small: 6 layers of a 1 MiB weight and a 256 KiB
activation, an arena of 2) with
--json=- in a fresh TMPDIR and checks the document: it parses, keeps the top-level fields, has
train_step.bound_seconds > 0 and one run per policy (belady, lru, on-demand) with every field,
and the NVMe temporary directory is gone afterwards. No timing assertions: the machine may be
busy."""
import os
import sys
import tempfile

from bench_common import CONFIG_FIELDS, run_bench

POLICIES = ["belady", "lru", "on-demand"]
RUN_FIELDS = {"policy", "step_seconds", "ratio_to_bound", "stall_seconds", "bytes_moved", "hits",
              "misses", "prefetches_issued", "prefetches_used", "prefetches_late",
              "prefetches_wasted", "prefetches_failed", "prefetch_accuracy", "compute_seconds",
              "seconds_per_move", "all_step_seconds"}
BOUND_FIELDS = {"bound_seconds", "compute_seconds", "transfer_bytes", "transfer_seconds",
                "link_gbps", "h2d_gbps", "nvme_read_gbps", "layers", "layer_bytes",
                "activation_bytes", "compute_ms",
                "arena_layers", "home", "link_throttle_gbps", "steps", "sync_each_layer", "runs"}
LAYERS, LAYER_BYTES, ACTIVATION_BYTES, COMPUTE_MS, ARENA_LAYERS = 6, 1 << 20, 256 << 10, 2, 2


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="offload-bench-train-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("STRATA_NVME_PATHS", None)
        doc = run_bench(bench, ["--workload=train-step", f"--layers={LAYERS}", "--layer-bytes=1MiB",
                                "--activation-bytes=256KiB",
                                f"--compute-ms={COMPUTE_MS}", f"--arena-layers={ARENA_LAYERS}",
                                "--steps=1"], env)
        left = os.listdir(tmpdir)
        assert not left, f"offload-bench left {left} in TMPDIR={tmpdir}"

    missing = {"version", "backend", "device", "config", "results", "train_step"} - doc.keys()
    assert not missing, f"top-level fields missing: {missing}"
    missing = CONFIG_FIELDS - doc["config"].keys()
    assert not missing, f"config fields missing: {missing}"
    assert doc["results"] == [], "the path rows are for --workload=paths"
    assert len(doc["config"]["nvme_paths"]) == 1, doc["config"]
    assert doc["config"]["nvme_paths"][0].startswith(tmpdir + "/strata-bench-"), doc["config"]

    ts = doc["train_step"]
    missing = BOUND_FIELDS - ts.keys()
    assert not missing, f"train_step fields missing: {missing}"
    assert ts["bound_seconds"] > 0, ts
    assert ts["layers"] == LAYERS and ts["layer_bytes"] == LAYER_BYTES, ts
    assert ts["activation_bytes"] == ACTIVATION_BYTES, ts
    assert ts["arena_layers"] == ARENA_LAYERS and ts["home"] == "nvme" and ts["steps"] == 1, ts
    # The bound's parts as documented: compute 2*L*c, transfer 2*(L-A)*(S+a) over the slower link.
    assert abs(ts["compute_seconds"] - 2 * LAYERS * COMPUTE_MS / 1000) < 1e-6, ts
    assert ts["transfer_bytes"] == 2 * (LAYERS - ARENA_LAYERS) * (LAYER_BYTES + ACTIVATION_BYTES), ts
    assert ts["h2d_gbps"] > 0 and ts["nvme_read_gbps"] > 0, ts
    assert ts["link_gbps"] <= min(ts["h2d_gbps"], ts["nvme_read_gbps"]) + 1e-4, ts
    assert ts["bound_seconds"] >= max(ts["compute_seconds"], ts["transfer_seconds"]) - 1e-6, ts

    assert [r["policy"] for r in ts["runs"]] == POLICIES, ts["runs"]
    for run in ts["runs"]:
        missing = RUN_FIELDS - run.keys()
        assert not missing, f"{run['policy']}: fields missing: {missing}"
        assert run["step_seconds"] > 0, run
        assert run["ratio_to_bound"] > 0, run
        assert run["stall_seconds"] >= 0 and run["bytes_moved"] >= 0, run
        # One acquire per tensor (weight and activation) and pass.
        assert run["hits"] + run["misses"] == 2 * 2 * LAYERS, f"one acquire per tensor and pass: {run}"
        assert len(run["all_step_seconds"]) == 1, run
    on_demand = ts["runs"][2]
    assert on_demand["prefetches_issued"] == 0, f"on-demand prefetched: {on_demand}"
    print("offload-bench train-step JSON ok: bound", ts["bound_seconds"], "s;",
          ", ".join(f"{r['policy']} {r['step_seconds']} s ({r['ratio_to_bound']}x)"
                    for r in ts["runs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
