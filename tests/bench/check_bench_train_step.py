#!/usr/bin/env python3
"""Runs offload-bench --workload=train-step (small: 6 layers of a 1 MiB weight, a 256 KiB
activation and a 1 MiB gradient, an arena of 2 layers, forward, backward and the optimizer pass)
with --json=- in a fresh TMPDIR and checks the document: it parses, keeps the top-level fields,
has train_step.bound_seconds > 0 and one run per policy (belady, lru, on-demand) with every
field, the paging model's Belady fetches less than its LRU (the step is no palindrome), and the
NVMe temporary directory is gone afterwards. Then --policies runs a subset in the order given,
and --activations=stash sends the activations through an ActivationStash (check_stash: its
counters' invariants). The first run also writes --timeline (check_timeline: the Chrome trace's
structure and the per-run summaries). No timing assertions: the machine may be busy."""
import json
import os
import sys
import tempfile

from bench_common import CONFIG_FIELDS, run_bench

POLICIES = ["belady", "lru", "on-demand"]
RUN_FIELDS = {"policy", "step_seconds", "ratio_to_bound", "ratio_to_arena_bound", "stall_seconds",
              "bytes_moved", "bytes_to_gpu", "bytes_from_gpu", "hits",
              "misses", "prefetches_issued", "prefetches_used", "prefetches_late",
              "prefetches_wasted", "prefetches_failed", "prefetch_accuracy", "compute_seconds",
              "seconds_per_move", "seconds_per_fetch", "seconds_per_write_back",
              "all_step_seconds", "timeline", "early_writebacks", "early_writebacks_used",
              "early_writebacks_wasted", "discards"}
BOUND_FIELDS = {"bound_seconds", "arena_bound_seconds", "arena_bound_cut",
                "arena_bound_cross_bytes", "arena_bound_link", "compute_seconds", "transfer_bytes",
                "transfer_seconds",
                "link_gbps", "h2d_gbps", "nvme_read_gbps", "layers", "layer_bytes",
                "activation_bytes", "compute_ms", "optimizer", "optimizer_ms", "arena_layers",
                "arena_bytes", "home", "link_throttle_gbps", "steps", "sync_each_layer", "model",
                "runs", "discard", "early_writeback"}
MODEL_FIELDS = {"misses", "fetched_bytes", "written_back_bytes"}
LAYERS, LAYER_BYTES, ACTIVATION_BYTES, COMPUTE_MS, OPTIMIZER_MS, ARENA_LAYERS = (
    6, 1 << 20, 256 << 10, 2, 1, 2)
# Acquires per step: forward (weight, activation), backward (activation, weight, gradient),
# optimizer (gradient, weight).
ACQUIRES = LAYERS * (2 + 3 + 2)
ARGS = ["--workload=train-step", f"--layers={LAYERS}", "--layer-bytes=1MiB",
        "--activation-bytes=256KiB", f"--compute-ms={COMPUTE_MS}", f"--optimizer-ms={OPTIMIZER_MS}",
        f"--arena-layers={ARENA_LAYERS}", "--steps=1",
        "--overlap-step=none"]  # check_bench_overlap_step.py checks that part


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="offload-bench-train-") as tmpdir, \
            tempfile.TemporaryDirectory(prefix="offload-bench-trace-") as tracedir:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("STRATA_NVME_PATHS", None)
        trace = os.path.join(tracedir, "step.json")
        doc = run_bench(bench, ARGS + [f"--timeline={trace}"], env)
        left = os.listdir(tmpdir)
        assert not left, f"offload-bench left {left} in TMPDIR={tmpdir}"
        check_timeline(trace, doc["train_step"])

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
    assert ts["optimizer"] is True and ts["optimizer_ms"] == OPTIMIZER_MS, ts
    # The bound's parts as documented: compute L*(2c + o), transfer the model's Belady fetches
    # over the slower link.
    assert abs(ts["compute_seconds"] - LAYERS * (2 * COMPUTE_MS + OPTIMIZER_MS) / 1000) < 1e-6, ts
    layer = LAYER_BYTES + ACTIVATION_BYTES + LAYER_BYTES
    assert ARENA_LAYERS * layer <= ts["arena_bytes"] < (ARENA_LAYERS + 1) * layer, ts
    model = ts["model"]
    for policy in ("belady", "lru"):
        missing = MODEL_FIELDS - model[policy].keys()
        assert not missing, f"model {policy}: fields missing: {missing}"
    assert ts["transfer_bytes"] == model["belady"]["fetched_bytes"], ts
    # The reason the policies differ, deterministic: the optimizer pass ends at the last layer
    # and the next forward starts at the first (a cyclic scan), so LRU evicts the weights the
    # forward needs first while Belady keeps some of them.
    assert model["belady"]["misses"] < model["lru"]["misses"], model
    assert model["belady"]["fetched_bytes"] < model["lru"]["fetched_bytes"], model
    assert ts["h2d_gbps"] > 0 and ts["nvme_read_gbps"] > 0, ts
    assert ts["link_gbps"] <= min(ts["h2d_gbps"], ts["nvme_read_gbps"]) + 1e-4, ts
    assert ts["bound_seconds"] >= max(ts["compute_seconds"], ts["transfer_seconds"]) - 1e-6, ts

    check_arena_bound(ts)

    assert [r["policy"] for r in ts["runs"]] == POLICIES, ts["runs"]
    for run in ts["runs"]:
        missing = RUN_FIELDS - run.keys()
        assert not missing, f"{run['policy']}: fields missing: {missing}"
        assert run["step_seconds"] > 0, run
        assert run["ratio_to_bound"] > 0, run
        assert run["stall_seconds"] >= 0 and run["bytes_moved"] >= 0, run
        # One acquire per tensor (weight and activation) and pass.
        assert run["bytes_to_gpu"] + run["bytes_from_gpu"] <= run["bytes_moved"], run
        assert run["hits"] + run["misses"] == ACQUIRES, f"one acquire per tensor and pass: {run}"
        assert len(run["all_step_seconds"]) == 1, run
        # --discard (the default): each step discards every activation after backward's read
        # and every gradient after the optimizer's.
        assert run["discards"] == 2 * LAYERS, run
    assert ts["discard"] is True and ts["early_writeback"] is True, ts
    on_demand = ts["runs"][2]
    assert on_demand["prefetches_issued"] == 0, f"on-demand prefetched: {on_demand}"

    # --policies: a subset, in the order given; the CPU home, no NVMe directory; nothing
    # discarded and no early write-back: the model writes the dead bytes back too.
    doc = run_bench(bench, ARGS + ["--home=cpu", "--policies=lru,belady", "--discard=off",
                                   "--early-writeback=off"], os.environ)
    assert doc["train_step"]["discard"] is False, doc["train_step"]
    for run in doc["train_step"]["runs"]:
        assert run["discards"] == 0 and run["early_writebacks"] == 0, run
    kept = doc["train_step"]["model"]
    for policy in ("belady", "lru"):
        assert model[policy]["written_back_bytes"] < kept[policy]["written_back_bytes"], \
            (policy, model, kept)
    got = [r["policy"] for r in doc["train_step"]["runs"]]
    assert got == ["lru", "belady"], got
    check_arena_bound(doc["train_step"])
    # The CPU home: the H2D link alone; the optimizer pass reads every gradient and weight after
    # forward and backward, and the arena holds ARENA_LAYERS layers of them at most.
    assert doc["train_step"]["arena_bound_link"] == "H2D", doc["train_step"]
    assert doc["train_step"]["nvme_read_gbps"] is None, doc["train_step"]
    assert all(r["timeline"] is None for r in doc["train_step"]["runs"]), "no --timeline"
    check_stash(bench)
    print("offload-bench train-step JSON ok: bound", ts["bound_seconds"], "s;",
          ", ".join(f"{r['policy']} {r['step_seconds']} s ({r['ratio_to_bound']}x)"
                    for r in ts["runs"]))
    return 0


def check_arena_bound(ts):
    """The arena-aware bound is at least the old one and names its cut; each run's ratio to it
    is its step over it (within the JSON's rounding). No timings."""
    assert ts["arena_bound_seconds"] >= ts["bound_seconds"] - 1e-6, ts
    assert ts["arena_bound_cut"].split(" ")[0] in ("forward", "backward", "optimizer"), ts
    assert int(ts["arena_bound_cut"].split(" ")[1]) < ts["layers"], ts
    assert ts["arena_bound_cross_bytes"] >= 0, ts
    assert ts["arena_bound_link"] in ("H2D", "NVMe read"), ts
    for run in ts["runs"]:
        want = run["step_seconds"] / ts["arena_bound_seconds"]
        assert abs(run["ratio_to_arena_bound"] - want) <= 1e-3 * want + 1e-4, \
            (run["policy"], run["ratio_to_arena_bound"], want)
        assert run["ratio_to_arena_bound"] <= run["ratio_to_bound"] + 1e-3, run


def check_timeline(path, ts):
    """--timeline: the file is a Chrome trace with one process per policy; every span has a
    non-negative duration, every reference names a move of its process, each track's spans nest
    or follow one another (overlaps go on lanes), the step and every layer's compute are there;
    each run's summary splits the compute stream's idle time into causes that add up to it."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(processes.values()) == sorted(POLICIES), processes
    for pid, policy in processes.items():
        spans = [e for e in events if e["ph"] == "X" and e["pid"] == pid]
        assert all(e["dur"] >= 0 for e in spans), policy
        moves = [e["args"]["id"] for e in spans if e["cat"] == "move"]
        assert moves and len(moves) == len(set(moves)), f"{policy}: move ids not unique"
        for e in spans:
            if "ref" in e["args"]:
                assert e["args"]["ref"] in moves, f"{policy}: {e} names no recorded move"
            if e["cat"] == "move":
                for key in ("tensor", "from", "to", "bytes", "purpose", "issuer", "issue_us"):
                    assert key in e["args"], f"{policy}: move without {key}: {e}"
        assert sum(e["cat"] == "step" for e in spans) == ts["steps"], policy
        assert sum(e["cat"] == "compute" for e in spans) == ts["steps"] * LAYERS * 3, policy
        assert any(e["cat"] == "wait" for e in spans), policy
        by_track = {}
        for e in spans:
            by_track.setdefault(e["tid"], []).append(e)
        for tid, track in by_track.items():
            track.sort(key=lambda e: (e["ts"], -e["dur"]))
            open_ends = []
            for e in track:
                while open_ends and open_ends[-1] <= e["ts"] + 1e-3:
                    open_ends.pop()
                assert not open_ends or e["ts"] + e["dur"] <= open_ends[-1] + 1e-3, \
                    f"{policy}: spans overlap on track {tid}: {e}"
                open_ends.append(e["ts"] + e["dur"])
    for run in ts["runs"]:
        t = run["timeline"]
        assert t is not None, run
        assert abs(t["step_ms"] - run["step_seconds"] * 1e3) < 0.5, (t, run["step_seconds"])
        assert 0 <= t["compute_ms"] <= t["step_ms"] + 1e-3, t
        causes = sum(c["ms"] for c in t["idle_by_cause"])
        assert abs(causes - t["idle_ms"]) <= 0.02 * LAYERS * 3 + 0.01 * t["idle_ms"], t
        kinds = {m["kind"] for m in t["moves"]}
        assert any(k.startswith("nvme->gpu") for k in kinds), kinds


def check_stash(bench):
    """--activations=stash: the activations go through an ActivationStash (window 3, prefetch 2
    activations); invariants of its counters, not timings."""
    window, prefetch = 3 * ACTIVATION_BYTES, 2 * ACTIVATION_BYTES
    doc = run_bench(bench, ARGS + ["--home=cpu", "--policies=belady,on-demand", "--steps=2",
                                   "--activations=stash",
                                   f"--activation-window-bytes={window}",
                                   f"--activation-prefetch-bytes={prefetch}"], os.environ)
    ts = doc["train_step"]
    assert ts["activations"] == "stash", ts
    check_arena_bound(ts)
    assert ts["activation_window_bytes"] == window, ts
    assert ts["activation_prefetch_bytes"] == prefetch, ts
    # The arena: the layers' weights and gradients, plus the window (not the activations).
    assert ARENA_LAYERS * 2 * LAYER_BYTES + window <= ts["arena_bytes"], ts
    assert ts["arena_bytes"] < ARENA_LAYERS * 2 * LAYER_BYTES + window + LAYER_BYTES, ts
    kept = prefetch // ACTIVATION_BYTES  # keep_tail keeps backward's first activations
    assert ts["activation_transfer_bytes"] == (LAYERS - kept) * ACTIVATION_BYTES, ts
    model = ts["model"]["belady"]
    assert ts["transfer_bytes"] == model["fetched_bytes"] + ts["activation_transfer_bytes"], ts
    assert ts["d2h_bytes"] == model["written_back_bytes"] + ts["activation_transfer_bytes"], ts
    for run in ts["runs"]:
        a = run["activations"]
        assert a is not None, run
        # Every activation saved in forward is loaded once in backward.
        assert a["loads"] == LAYERS, a
        assert a["loads_prefetched"] + a["loads_kept"] + a["loads_on_demand"] == a["loads"], a
        # Once the order is known (the warm-up step), the first loads are kept and the rest
        # come back by prefetch: what is not kept went home and came back.
        assert a["loads_kept"] == kept, a
        assert a["bytes_out"] == (LAYERS - a["loads_kept"]) * ACTIVATION_BYTES, a
        assert a["gpu_peak_bytes"] <= window, a
        assert run["gpu_tier_peak_bytes"] <= ts["arena_bytes"], run
        # The store's acquires: weights and gradients (5 per layer), and the stash's own: each
        # activation written (allocate) and loaded, and each prefetch its fetcher carried out.
        acquires = LAYERS * (1 + 2 + 2) + 2 * LAYERS + a["loads_prefetched"]
        assert run["hits"] + run["misses"] == acquires, run
        assert len(run["all_step_seconds"]) == 2, run


if __name__ == "__main__":
    sys.exit(main())
