#!/usr/bin/env python3
"""Runs offload-bench --workload=zero (a ZeRO stage 3 step against its overlap bound; small:
4 layers of 256 KiB, 200 us of compute per layer, 2 steps) with --json=- in a fresh TMPDIR and
checks the document's "zero" object field by field.

  check_zero3_json.py STRATA_RUN BENCH RANKS HOME [auto]   under strata-run -n RANKS
  check_zero3_json.py - BENCH 1 HOME [auto]                alone
  ... [overlap]                                             with --overlap-step=on

HOME is the shards' home (gpu, cpu or nvme; nvme uses a temporary directory under TMPDIR, which
must be gone afterwards). Without "auto" the run gives --prefetch-bytes, --max-live-bytes and
--reuse-window-bytes (1, 3 and 1 layers); with it their defaults (2 and 4 layers, and the
engine's 64 MiB). Only rank 0 writes: stdout is exactly
one JSON document, and the human table (stderr) has one line per rank.

No timing assertions (the machine may be busy): times must be non-negative, the derived figures
the documented functions of the reported ones (bound, ratio, exposed fraction, goal), the parts
of a step within it, and the counts and bytes those of the layout: one reduce-scatter of every
layer per step, an all-gather per gather, the own shard read from NVMe once per step, the
gathered bytes never above --max-live-bytes.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

from bench_common import CONFIG_FIELDS

LAYERS, LAYER_BYTES, STEPS, COMPUTE = 4, 256 << 10, 2, 200e-6
ALIGNMENT = 64
BASELINE_SAMPLES = 5  # before the steps, and as many after (the collectives)
TIME_FIELDS = {"forward_seconds", "backward_seconds", "step_call_seconds", "compute_seconds",
               "optimizer_seconds", "fetch_wait_seconds", "gather_wait_seconds",
               "reduce_scatter_wait_seconds",
               "acquire_param_seconds", "release_param_seconds", "acquire_grad_seconds",
               "grad_ready_seconds", "grad_copy_seconds", "outside_compute_seconds",
               "exposed_comm_seconds"}
COUNT_FIELDS = {"gathers", "gathers_on_demand", "gathers_prefetched", "reuses", "prefetch_late",
                "gathers_dropped_unused", "order_changes", "gathered_peak_bytes",
                "all_gather_bytes", "reduce_scatter_bytes", "nvme_read_bytes"}
SAMPLE_FIELDS = TIME_FIELDS | COUNT_FIELDS | {"exposed_comm_fraction", "overlap_bound_seconds",
                                              "ratio", "bound", "goal",
                                              "exposed_with_grad_waits_seconds",
                                              "exposed_with_grad_waits_fraction",
                                              "optimizer_step_seconds", "early_elements",
                                              "rolled_back", "early_wait_seconds"}
ZERO_FIELDS = {"ranks", "stage", "backend", "param_home", "state_home", "layers", "layer_bytes",
               "layer_params", "padded_params", "shard_params", "gathered_layer_bytes",
               "shard_bytes", "prefetch_bytes", "max_live_bytes", "reuse_window_bytes", "steps",
               "layer_compute_seconds", "baselines", "step_seconds", "all_step_seconds",
               "slowest_rank", "per_rank", "overlap"} | SAMPLE_FIELDS
RANK_FIELDS = {"rank", "step_seconds", "all_step_seconds", "model_state_bytes",
               "model_state_bytes_by_tier", "mean_nvme_read_bytes", "rollback_rate"} | SAMPLE_FIELDS
BOUND_FIELDS = {"compute_seconds", "gather_seconds", "reduce_scatter_seconds", "comm_seconds",
                "shard_read_seconds", "optimizer_seconds", "seconds"}
EPS = 2e-5  # seconds: each is rounded to 1e-6 and sums of up to a dozen of them are compared


def close(a, b, rel=2e-3, abs_tol=4e-6):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def lower_median(values):
    return sorted(values)[(len(values) - 1) // 2]


def check_sample(s, zero, where):
    missing = SAMPLE_FIELDS - s.keys()
    assert not missing, f"{where}: fields missing: {missing}"
    assert all(s[k] >= 0 for k in TIME_FIELDS | COUNT_FIELDS), f"{where}: {s}"
    step = s["step_seconds"]
    assert step > 0 and s["compute_seconds"] > 0 and s["optimizer_seconds"] > 0, f"{where}: {s}"
    # The parts of a step lie within it.
    parts = s["forward_seconds"] + s["backward_seconds"] + s["step_call_seconds"]
    assert parts <= step + EPS, f"{where}: parts {parts} > step {step}"
    assert s["compute_seconds"] <= s["forward_seconds"] + s["backward_seconds"] + EPS, where
    assert s["optimizer_seconds"] <= s["step_call_seconds"] + EPS, where
    assert s["reduce_scatter_wait_seconds"] <= s["step_call_seconds"] + EPS, where
    # acquire_param only fetches on the host (fetch_wait is its host time doing so); the gathers
    # are waited for on the trainer's stream, which the host synchronizes before each layer's
    # compute (gather_wait). Those waits, the compute and the calls take turns on the host
    # inside the forward and backward loops.
    assert s["fetch_wait_seconds"] <= s["acquire_param_seconds"] + EPS, f"{where}: {s}"
    loops = s["forward_seconds"] + s["backward_seconds"]
    host = s["compute_seconds"] + s["gather_wait_seconds"] + s["acquire_param_seconds"]
    assert host <= loops + EPS, f"{where}: {s}"
    exposed = s["fetch_wait_seconds"] + s["gather_wait_seconds"] + s["reduce_scatter_wait_seconds"]
    assert close(s["exposed_comm_seconds"], exposed), f"{where}: {s}"
    # Every exposed wait lies outside the compute and the optimizer, in the step.
    assert exposed <= s["outside_compute_seconds"] + EPS, f"{where}: {s}"
    fraction = s["exposed_comm_fraction"]
    assert 0 <= fraction <= 1, f"{where}: exposed fraction {fraction}"
    assert math.isclose(fraction, exposed / step, abs_tol=2e-4 + 2e-6 / step), f"{where}: {s}"
    with_waits = exposed + s["acquire_grad_seconds"]
    assert close(s["exposed_with_grad_waits_seconds"], with_waits, abs_tol=EPS), f"{where}: {s}"
    assert 0 <= s["exposed_with_grad_waits_fraction"] <= 1, f"{where}: {s}"
    assert math.isclose(s["exposed_with_grad_waits_fraction"], with_waits / step,
                        abs_tol=2e-4 + 4e-6 / step), f"{where}: {s}"
    outside = max(0.0, step - s["compute_seconds"] - s["optimizer_seconds"])
    assert close(s["outside_compute_seconds"], outside, abs_tol=EPS), f"{where}: {s}"
    # Counts per step: every layer is used in forward and in backward; each use is a gather
    # (prefetched or on demand) or a reuse; prefetched gathers dropped unused are extra. In
    # steady state the gathers this step prefetches for the next equal those the last one did.
    layers, padded = zero["layers"], zero["padded_params"]
    assert s["gathers"] == s["gathers_on_demand"] + s["gathers_prefetched"], f"{where}: {s}"
    assert s["gathers"] + s["reuses"] - s["gathers_dropped_unused"] == 2 * layers, f"{where}: {s}"
    assert layers <= s["gathers"], f"{where}: {s}"
    assert s["prefetch_late"] <= 2 * layers and s["order_changes"] == 0, f"{where}: {s}"
    assert s["all_gather_bytes"] == s["gathers"] * padded * 2, f"{where}: {s}"
    assert s["reduce_scatter_bytes"] == layers * padded * 2, f"{where}: {s}"
    # ZeRO-Infinity: each rank reads its own shard from NVMe, whole shards of layers, about
    # once per step (the mean over the steps is checked per rank).
    if zero["param_home"] == "nvme":
        layer_shard = zero["shard_params"] * 2
        assert s["nvme_read_bytes"] % layer_shard == 0, f"{where}: {s}"
        assert 0 < s["nvme_read_bytes"] <= 2 * zero["shard_bytes"], f"{where}: {s}"
    else:
        assert s["nvme_read_bytes"] == 0, f"{where}: {s}"
    assert zero["gathered_layer_bytes"] <= s["gathered_peak_bytes"] <= zero["max_live_bytes"], \
        f"{where}: {s}"
    # The bound: max(compute, gathers x all_gather + layers x reduce_scatter, read) + optimizer.
    b, base = s["bound"], zero["baselines"]
    assert set(b) == BOUND_FIELDS, b
    assert b["compute_seconds"] == s["compute_seconds"], (b, s)
    assert b["optimizer_seconds"] == s["optimizer_seconds"], (b, s)
    # Every figure is rounded to 1e-6 s: a product of n of them is off by up to n x 0.5e-6.
    assert close(b["gather_seconds"], s["gathers"] * base["all_gather_seconds"],
                 abs_tol=1e-6 * (s["gathers"] + 2)), (b, base)
    assert close(b["reduce_scatter_seconds"], layers * base["reduce_scatter_seconds"],
                 abs_tol=1e-6 * (layers + 2)), (b, base)
    assert close(b["comm_seconds"], b["gather_seconds"] + b["reduce_scatter_seconds"]), b
    read = base["shard_read"]["seconds"] if base["shard_read"] else 0.0
    assert b["shard_read_seconds"] == read, (b, base)
    seconds = max(b["compute_seconds"], b["comm_seconds"], read) + b["optimizer_seconds"]
    assert close(b["seconds"], seconds), b
    assert s["overlap_bound_seconds"] == b["seconds"], s
    assert math.isclose(s["ratio"], step / b["seconds"], rel_tol=5e-3, abs_tol=1e-4), s
    goal = s["goal"]
    assert goal["exposed_fraction_max"] == 0.1, goal
    applies = (b["compute_seconds"] >= b["comm_seconds"] - EPS and
               b["compute_seconds"] >= read - EPS)
    if abs(b["compute_seconds"] - max(b["comm_seconds"], read)) > EPS:
        assert goal["applies"] == applies, (goal, b)
    if abs(fraction - 0.1) > 2e-4:
        assert goal["met"] == (goal["applies"] and fraction <= 0.1), (goal, fraction)


def check_zero(zero, ranks, home, auto):
    missing = ZERO_FIELDS - zero.keys()
    assert not missing, f"zero fields missing: {missing}"
    assert zero["ranks"] == ranks and zero["stage"] == 3 and zero["backend"] == "gloo", zero
    assert zero["param_home"] == home and zero["state_home"] == "cpu", zero
    assert zero["layers"] == LAYERS and zero["layer_bytes"] == LAYER_BYTES, zero
    assert zero["steps"] == STEPS and close(zero["layer_compute_seconds"], COMPUTE), zero
    # The layout: a layer padded to a multiple of ranks x alignment elements, equal shards.
    unit = ranks * ALIGNMENT
    params, padded = zero["layer_params"], zero["padded_params"]
    assert params == LAYER_BYTES // 2 and padded % unit == 0, zero
    assert params <= padded < params + unit, zero
    assert zero["shard_params"] * ranks == padded, zero
    assert zero["gathered_layer_bytes"] == padded * 2, zero
    assert zero["shard_bytes"] == LAYERS * zero["shard_params"] * 2, zero
    layer = zero["gathered_layer_bytes"]
    want = ((2 * layer, 4 * layer, 64 << 20) if auto else
            (LAYER_BYTES, 3 * LAYER_BYTES, LAYER_BYTES))
    got = (zero["prefetch_bytes"], zero["max_live_bytes"], zero["reuse_window_bytes"])
    assert got == want, (zero, want)
    # The baselines: medians of their samples (every sample the slowest rank's).
    base = zero["baselines"]
    assert base["calls_per_sample"] >= 1, base
    for kind in ("all_gather", "reduce_scatter"):
        samples = base[f"{kind}_samples"]
        assert len(samples) == 2 * BASELINE_SAMPLES and all(t > 0 for t in samples), base
        assert base[f"{kind}_seconds"] == lower_median(samples), base
    compute = base["compute_samples_ns"]
    assert compute and all(t > 0 for t in compute), base
    assert base["compute_ns_per_element"] == lower_median(compute), base
    elements = COMPUTE * 1e9 / base["compute_ns_per_element"]
    assert abs(base["compute_elements_per_layer"] - elements) <= 1e-3 * elements + 1, base
    read = base["shard_read"]
    if home == "nvme":
        assert read is not None, "--param-home=nvme but no shard read baseline"
        assert read["bytes"] >= zero["shard_bytes"] and read["seconds"] > 0, read
        assert len(read["samples"]) == BASELINE_SAMPLES, read
        assert read["seconds"] == lower_median(read["samples"]), read
    else:
        assert read is None, base
    # Each step counts with its slowest rank; the median is the lower middle one.
    steps = zero["all_step_seconds"]
    per_rank = zero["per_rank"]
    assert len(steps) == STEPS and all(t > 0 for t in steps), zero
    assert zero["step_seconds"] == lower_median(steps), zero
    assert [r["rank"] for r in per_rank] == list(range(ranks)), per_rank
    for s in range(STEPS):
        assert steps[s] == max(r["all_step_seconds"][s] for r in per_rank), (s, zero)
    slowest = zero["slowest_rank"]
    assert 0 <= slowest < ranks, zero
    assert zero["step_seconds"] in per_rank[slowest]["all_step_seconds"], zero
    check_sample(zero, zero, "zero")
    shard_total = LAYERS * zero["shard_params"]
    for r in per_rank:
        where = f"zero.per_rank[{r.get('rank')}]"
        missing = RANK_FIELDS - r.keys()
        assert not missing, f"{where}: fields missing: {missing}"
        assert len(r["all_step_seconds"]) == STEPS, r
        assert r["step_seconds"] == lower_median(r["all_step_seconds"]), r
        check_sample(r, zero, where)
        # The rank's optimizer: its step() time, and with --overlap-step=on the elements it
        # stepped early (at most its shard) and how often it rolled them back (no clipping and
        # no inf here, but a busy machine may land a gradient late: no count is asserted).
        assert r["optimizer_step_seconds"] > 0, r
        assert 0 <= r["early_elements"] <= shard_total, (r, shard_total)
        assert 0 <= r["rollback_rate"] <= 1, r
        if not zero["overlap"]:
            assert r["early_elements"] == 0 and r["rolled_back"] is False, r
            assert r["rollback_rate"] == 0 and r["early_wait_seconds"] == 0, r
        tiers = r["model_state_bytes_by_tier"]
        assert set(tiers) == {"gpu", "cpu", "nvme"}, tiers
        assert r["model_state_bytes"] == sum(tiers.values()), r
        # This rank's parameter shards in their home, its Adam states (12 bytes a parameter)
        # in the CPU tier: (4 + K)Ψ/N less the gradients, at least.
        assert tiers[home] >= 2 * shard_total, (r, shard_total)
        assert tiers["cpu"] >= 12 * shard_total, (r, shard_total)
        assert r["model_state_bytes"] >= 14 * shard_total, (r, shard_total)
        # Each rank reads its own shard of the model from NVMe once per step: over the timed
        # steps exactly, but for the reads the engine's prefetch hints (up to twice
        # --prefetch-bytes of gathered layers ahead) start in the background at either end.
        mean = r["mean_nvme_read_bytes"]
        if home == "nvme":
            hinted = 2 * zero["prefetch_bytes"] // ranks + zero["shard_params"] * 2
            assert abs(mean - zero["shard_bytes"]) * STEPS <= 2 * hinted, (r, zero["shard_bytes"])
        else:
            assert mean == 0, r


def main() -> int:
    strata_run, bench, ranks, home = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    extras = set(sys.argv[5:])
    auto = "auto" in extras
    overlap = "overlap" in extras  # --overlap-step=on
    launcher = [] if strata_run == "-" else [strata_run, "-n", str(ranks)]
    with tempfile.TemporaryDirectory(prefix="offload-bench-zero3-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        for name in ("STRATA_NVME_PATHS", "STRATA_NVME_BYTES", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                     "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        args = [*launcher, bench, "--workload=zero", f"--layers={LAYERS}",
                f"--layer-bytes={LAYER_BYTES}", "--layer-compute=200us", f"--steps={STEPS}",
                f"--param-home={home}", "--json=-"]
        if overlap:
            args.append("--overlap-step=on")
        if not auto:
            args += [f"--prefetch-bytes={LAYER_BYTES}", f"--max-live-bytes={3 * LAYER_BYTES}",
                     f"--reuse-window-bytes={LAYER_BYTES}"]
        run = subprocess.run(args, capture_output=True, text=True, env=env, timeout=240)
        if run.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {run.returncode}:\n{run.stderr}")
        left = sorted(os.listdir(tmpdir))
        assert not left, f"left in TMPDIR={tmpdir}: {left}"
    doc = json.loads(run.stdout)  # fails if another rank also wrote to stdout
    missing = {"version", "backend", "device", "config", "results", "zero"} - doc.keys()
    assert not missing, f"top-level fields missing: {missing}"
    missing = CONFIG_FIELDS - doc["config"].keys()
    assert not missing, f"config fields missing: {missing}"
    assert doc["results"] == [], doc["results"]
    zero = doc["zero"]
    assert zero["overlap"] is overlap, zero["overlap"]
    check_zero(zero, ranks, home, auto)
    # rank 0 prints the table: the job's line and one line per rank, then the goal.
    lines = run.stderr.splitlines()
    assert sum(1 for line in lines if line.startswith("rank ")) == ranks, run.stderr
    assert sum(1 for line in lines if line.startswith("job ")) == 1, run.stderr
    assert any(line.startswith("goal (exposed communication") for line in lines), run.stderr
    print(f"offload-bench zero JSON ok ({ranks} ranks, shards in {home}): step "
          f"{zero['step_seconds']} s, bound {zero['overlap_bound_seconds']} s (ratio "
          f"{zero['ratio']}), exposed {zero['exposed_comm_fraction']}, goal {zero['goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
