#!/usr/bin/env python3
"""Runs offload-bench --workload=train-step with --overlap-step (small: 4 layers of a 256 KiB
fp16 weight, one policy) with --json=- in a fresh TMPDIR and checks the "overlap_step" object:
  - both (states in the CPU tier, an inf every step): the runs off, on, on-clip, on-inf in that
    order with every field; the figures agree with each other (ratios against off, the bound's
    parts with the compute of forward and backward, each step no shorter than its forward,
    backward and step(), the forward's wait its time less its compute); off has no early work
    and no rollback; on keeps its early work and rolls nothing back; on-clip (a clip threshold
    below the norm) rolls back whatever was stepped early, every step; on-inf skips every step;
  - on (states on NVMe, an inf every second step): no off run, so no ratio against it; only the
    inf's steps are skipped and rolled back; nothing left in TMPDIR;
  - off (the host running ahead of the stream): the off run alone; none: "overlap_step" is null.
What the measured steps step early depends on the early stepper keeping up with backward, so
the counts asserted exactly are the warm-up step's, which waits for every early step: all kept
(on, on-inf), all rolled back and redone (on-clip). No timing assertions."""
import os
import sys
import tempfile

from bench_common import run_bench

LAYERS, LAYER_BYTES, COMPUTE_MS, STEPS = 4, 256 << 10, 10, 2
BASE = ["--workload=train-step", f"--layers={LAYERS}", "--layer-bytes=256KiB",
        f"--compute-ms={COMPUTE_MS}", f"--steps={STEPS}", "--policies=belady",
        "--activation-bytes=64KiB", "--arena-layers=2"]
TOP_FIELDS = {"mode", "state_home", "layers", "layer_bytes", "params", "chunk_elements",
              "compute_ms", "link_throttle_gbps", "steps", "inf_every", "bound_seconds",
              "compute_seconds", "transfer_seconds", "optimizer_seconds", "runs", "notes"}
RUN_FIELDS = {"name", "overlap", "max_grad_norm", "inf_every", "steps", "rollbacks",
              "rollback_rate", "exposed_seconds", "exposed_ratio", "exposed_after_landing_seconds",
              "exposed_after_landing_ratio", "forward_seconds",
              "forward_wait_seconds", "first_layer_wait_seconds", "backward_seconds",
              "step_seconds", "ratio_to_bound",
              "kept_exposed_seconds",
              "rolled_back_exposed_seconds", "rollback_cost", "early_elements",
              "overlap_host_bytes", "stats", "all_exposed_seconds", "all_step_seconds",
              "all_forward_seconds", "all_backward_seconds", "all_rolled_back", "all_skipped",
              "all_early_elements", "all_redone_elements",
              "warmup_early_elements", "warmup_redone_elements", "warmup_rolled_back"}
STATS_FIELDS = {"last_step_ns", "last_step_wait_ns", "last_adam_ns", "last_nvme_wait_ns",
                "last_early_elements", "last_redone_elements", "last_early_adam_ns",
                "last_rollback_ns", "last_early_wait_ns", "overlap_early_steps",
                "overlap_rollbacks", "overlap_host_bytes", "overlap_budget_misses"}
PARAMS = LAYERS * LAYER_BYTES // 2


def run(args, home):
    with tempfile.TemporaryDirectory(prefix="offload-bench-overlap-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("STRATA_NVME_PATHS", None)
        doc = run_bench(sys.argv[1], [*BASE, f"--home={home}", *args], env)
        left = os.listdir(tmpdir)
        assert not left, f"offload-bench left {left} in TMPDIR={tmpdir}"
    assert "train_step" in doc, doc.keys()
    return doc["overlap_step"]


def check_common(ov, mode, home, names, inf_every):
    missing = TOP_FIELDS - ov.keys()
    assert not missing, f"overlap_step fields missing: {missing}"
    assert ov["mode"] == mode and ov["state_home"] == home, ov
    assert ov["layers"] == LAYERS and ov["layer_bytes"] == LAYER_BYTES, ov
    assert ov["params"] == PARAMS and ov["steps"] == STEPS, ov
    assert ov["inf_every"] == inf_every and ov["chunk_elements"] > 0, ov
    # Forward and backward.
    assert abs(ov["compute_seconds"] - 2 * LAYERS * COMPUTE_MS / 1000) < 1e-6, ov
    bound = max(ov["compute_seconds"], ov["transfer_seconds"], ov["optimizer_seconds"])
    assert abs(ov["bound_seconds"] - bound) < 2e-6, ov
    assert ov["transfer_seconds"] >= 0 and ov["optimizer_seconds"] > 0, ov
    runs = {r["name"]: r for r in ov["runs"]}
    assert [r["name"] for r in ov["runs"]] == names, ov["runs"]
    for r in ov["runs"]:
        missing = RUN_FIELDS - r.keys()
        assert not missing, f"{r['name']}: fields missing: {missing}"
        missing = STATS_FIELDS - r["stats"].keys()
        assert not missing, f"{r['name']}: stats fields missing: {missing}"
        assert r["steps"] == STEPS, r
        for key in ("all_exposed_seconds", "all_step_seconds", "all_forward_seconds",
                    "all_backward_seconds", "all_rolled_back", "all_skipped",
                    "all_early_elements", "all_redone_elements"):
            assert len(r[key]) == STEPS, (key, r)
        assert r["exposed_seconds"] in r["all_exposed_seconds"], r
        assert r["exposed_seconds"] > 0 and r["step_seconds"] > 0, r
        assert abs(r["exposed_seconds"] - r["stats"]["last_step_ns"] * 1e-9) < 2e-6, r
        landed = max(0, r["stats"]["last_step_ns"] - r["stats"]["last_step_wait_ns"]) * 1e-9
        assert abs(r["exposed_after_landing_seconds"] - landed) < 2e-6, r
        assert r["rollbacks"] == sum(r["all_rolled_back"]), r
        assert abs(r["rollback_rate"] - r["rollbacks"] / STEPS) < 1e-4, r
        assert r["early_elements"] in r["all_early_elements"], r
        assert all(0 <= e <= PARAMS for e in r["all_early_elements"]), r
        assert abs(r["ratio_to_bound"] - r["step_seconds"] / ov["bound_seconds"]) < 1e-3, r
        check_forward(r)
        assert r["overlap"] == (r["name"] != "off"), r
        # The warm-up step waits for every early step before step(), so its outcome does not
        # depend on the stepper keeping up with backward: everything stepped early, then kept
        # (rolled back and redone with clipping).
        if r["name"] == "off":
            assert r["warmup_early_elements"] == 0 and r["warmup_redone_elements"] == 0, r
            assert not r["warmup_rolled_back"], r
        elif r["name"] == "on-clip":
            assert r["warmup_early_elements"] == 0 and r["warmup_redone_elements"] == PARAMS, r
            assert r["warmup_rolled_back"], r
        else:
            assert r["warmup_early_elements"] == PARAMS and r["warmup_redone_elements"] == 0, r
            assert not r["warmup_rolled_back"], r
        if r["name"] == "on-clip":
            assert 0 < r["max_grad_norm"] < 1e-3, r
            # Clipping bites every step: whatever the stepper did early is rolled back and
            # redone, nothing kept (in the measured steps that is every unit it reached).
            assert not any(r["all_early_elements"]), r
            assert r["all_rolled_back"] == [e > 0 for e in r["all_redone_elements"]], r
        else:
            assert r["max_grad_norm"] == 0, r
        if r["name"] == "on-inf":
            assert r["inf_every"] == inf_every, r
            expected = [(s + 1) % inf_every == 0 for s in range(STEPS)]
            assert r["all_skipped"] == expected, r
            # An overflow skips the step and rolls back whatever the stepper did early (on a
            # loaded machine perhaps nothing): only skipped steps roll back.
            assert all(s or not rb for s, rb in zip(r["all_skipped"], r["all_rolled_back"])), r
        else:
            assert r["inf_every"] == 0 and not any(r["all_skipped"]), r
    return runs


def median(values):
    """The lower middle one for an even count, as the bench's."""
    return sorted(values)[(len(values) - 1) // 2]


def check_forward(r):
    """Each measured step is forward + backward + step(), in that order, timed end to end (every
    figure printed to the microsecond); the forward's wait is its time less its compute."""
    rounding = 2e-6
    forward_compute = LAYERS * COMPUTE_MS / 1000
    for step, forward, backward, exposed in zip(r["all_step_seconds"], r["all_forward_seconds"],
                                                r["all_backward_seconds"],
                                                r["all_exposed_seconds"]):
        assert forward > 0 and backward > 0, r
        assert step >= forward + backward + exposed - 2 * rounding, r
    assert r["backward_seconds"] in r["all_backward_seconds"], r
    assert r["step_seconds"] == median(r["all_step_seconds"]), r
    assert abs(r["forward_seconds"] - median(r["all_forward_seconds"])) <= rounding, r
    wait = r["forward_wait_seconds"]
    assert abs(wait - (r["forward_seconds"] - forward_compute)) <= rounding, r
    # The compute is a timed wait on the stream, so the forward lasts at least as long.
    assert wait >= -1e-4, r
    # The first layer's wait is part of the forward's (per step, so for the medians too).
    assert -1e-4 <= r["first_layer_wait_seconds"] <= wait + 2 * rounding, r


def close_ratio(ratio, a, b):
    """ratio (4 decimals) against a / b, each printed to the microsecond."""
    expected = a / b
    slack = 1e-4 + expected * (0.5e-6 / max(a, 1e-9) + 0.5e-6 / b)
    return abs(ratio - expected) <= slack


def check_ratios(runs):
    off = runs["off"]
    for r in runs.values():
        assert close_ratio(r["exposed_ratio"], r["exposed_seconds"], off["exposed_seconds"]), r
        if off["exposed_after_landing_seconds"] > 0:
            assert close_ratio(r["exposed_after_landing_ratio"], r["exposed_after_landing_seconds"],
                               off["exposed_after_landing_seconds"]), r
        if r["rollbacks"]:
            assert close_ratio(r["rollback_cost"], r["rolled_back_exposed_seconds"],
                               off["exposed_seconds"]), r
        else:
            assert r["rollback_cost"] == 0 and r["rolled_back_exposed_seconds"] == 0, r


def main() -> int:
    # Both, states in the CPU tier, an inf every step.
    ov = run(["--overlap-step=both", "--overlap-inf-every=1"], "cpu")
    runs = check_common(ov, "both", "cpu", ["off", "on", "on-clip", "on-inf"], 1)
    check_ratios(runs)
    off, on, clip, inf = runs["off"], runs["on"], runs["on-clip"], runs["on-inf"]
    assert off["exposed_ratio"] == 1.0, off
    assert off["rollbacks"] == 0 and not any(off["all_early_elements"]), off
    assert off["overlap_host_bytes"] == 0 and off["stats"]["overlap_early_steps"] == 0, off
    # Overlap without clipping or an inf: early work, kept, never rolled back.
    assert on["rollbacks"] == 0 and on["rollback_rate"] == 0, on
    assert not any(on["all_redone_elements"]), on
    assert on["overlap_host_bytes"] > 0 and on["stats"]["overlap_rollbacks"] == 0, on
    # A clip threshold below the norm: the warm-up's and every measured step's early work
    # rolled back (checked in check_common), counted (stats: after the median step).
    assert 1 <= clip["stats"]["overlap_rollbacks"] <= 1 + clip["rollbacks"], clip
    assert clip["rollback_cost"] > 0 or clip["rollbacks"] == 0, clip
    # An inf every step: every step skipped (and its early work, if any, rolled back).
    assert all(inf["all_skipped"]), inf
    assert not any(inf["all_early_elements"]), inf

    # On, states on NVMe, an inf every second step: no off run to compare with.
    ov = run(["--overlap-step=on", "--overlap-inf-every=2"], "nvme")
    runs = check_common(ov, "on", "nvme", ["on", "on-clip", "on-inf"], 2)
    for r in runs.values():
        assert r["exposed_ratio"] == 0 and r["rollback_cost"] == 0, r
        assert r["exposed_after_landing_ratio"] == 0, r
    assert runs["on-inf"]["rollback_rate"] <= 0.5, runs["on-inf"]
    assert runs["on"]["rollbacks"] == 0, runs["on"]

    # Off alone, the host running ahead of its stream (the forward's end taken on the stream);
    # none.
    ov = run(["--overlap-step=off", "--sync-each-layer=false"], "cpu")
    runs = check_common(ov, "off", "cpu", ["off"], 2)
    check_ratios(runs)
    assert run(["--overlap-step=none"], "cpu") is None
    print("ok: overlap_step (both, on with NVMe states, off, none)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
