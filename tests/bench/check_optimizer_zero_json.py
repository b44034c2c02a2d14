#!/usr/bin/env python3
"""Runs offload-bench --workload=optimizer over ranks (the ZeRO-DP partitioned step against the
single-rank step / N; small: --params=1M --repeat=2) with --json=- in a fresh TMPDIR and checks
the document's "optimizer" object and its "zero" object field by field.

  check_optimizer_zero_json.py STRATA_RUN BENCH RANKS STAGE [nvme]   under strata-run -n RANKS
  check_optimizer_zero_json.py - BENCH 1 STAGE [nvme]                alone, with --zero-stage

With "nvme", STRATA_NVME_PATHS is a temporary directory: "optimizer.nvme" (with its own "zero")
must be present and the directory empty afterwards. Only rank 0 writes: stdout is exactly one
JSON document, and the human lines (stderr) have one line per rank.

No timing assertions (the machine may be busy): times must be positive, the derived figures the
documented quotients of the reported ones, and the bytes the Communicator counted those of the
layout (a reduce-scatter and an all-gather of every padded group, and the statistics all-reduce).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

from bench_common import CONFIG_FIELDS
from check_optimizer_json import check_stats

PARAMS, REPEAT = 1_000_000, 2
DTYPE_BYTES = 2  # fp16 parameters and gradients, the workload's default
OPTIMIZER_FIELDS = {"params", "dtype", "bytes_per_param", "tensors", "repeat", "isa", "threads",
                    "step_seconds", "all_step_seconds", "stats", "zero"}
SAMPLE_FIELDS = {"exposed_comm_seconds", "reduce_scatter_wait_seconds", "gather_seconds",
                 "stats_all_reduce_seconds", "optimizer_seconds", "adam_seconds",
                 "outside_optimizer_seconds", "engine_step_seconds", "grad_phase_seconds"}
ZERO_FIELDS = {"ranks", "stage", "backend", "state_home", "bucket_bytes", "gradient_buckets",
               "alignment", "groups", "padded_params", "shard_params", "single_step_seconds",
               "ideal_seconds", "step_seconds", "ratio", "all_step_seconds", "slowest_rank",
               "comm_bytes_per_step", "engine_comm_bytes_per_step", "comm_bytes",
               "per_rank"} | SAMPLE_FIELDS
RANK_FIELDS = {"rank", "step_seconds", "all_step_seconds", "comm_bytes_per_step",
               "model_state_bytes", "model_state_bytes_by_tier", "bucket_bytes"} | SAMPLE_FIELDS


def close(a, b, rel=2e-3, abs_tol=4e-6):
    """The JSON rounds seconds to 1e-6 and ratios to 1e-4."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def check_sample(obj, where, ranks):
    missing = SAMPLE_FIELDS - obj.keys()
    assert not missing, f"{where}: fields missing: {missing}"
    assert all(obj[key] >= 0 for key in SAMPLE_FIELDS), f"{where}: {obj}"
    for key in ("engine_step_seconds", "optimizer_seconds", "adam_seconds", "grad_phase_seconds"):
        assert obj[key] > 0, f"{where}: {key}: {obj}"
    # The statistics all-reduce is timed (alone it may round to 0 at 1e-6 s).
    assert ranks == 1 or obj["stats_all_reduce_seconds"] > 0, f"{where}: {obj}"
    # The engine's step: waiting for reduce-scatters, the optimizer and the gathers are parts of
    # it; the Adam kernels and the statistics all-reduce are parts of the optimizer's time.
    parts = obj["reduce_scatter_wait_seconds"] + obj["optimizer_seconds"] + obj["gather_seconds"]
    assert parts <= obj["engine_step_seconds"] + 4e-6, f"{where}: parts {parts}: {obj}"
    inner = obj["adam_seconds"] + obj["stats_all_reduce_seconds"]
    assert inner <= obj["optimizer_seconds"] + 3e-6, f"{where}: {inner}: {obj}"
    exposed = (obj["reduce_scatter_wait_seconds"] + obj["gather_seconds"] +
               obj["stats_all_reduce_seconds"])
    assert close(obj["exposed_comm_seconds"], exposed), f"{where}: {obj}"
    outside = obj["engine_step_seconds"] - obj["optimizer_seconds"]
    assert close(obj["outside_optimizer_seconds"], max(0.0, outside)), f"{where}: {obj}"


def check_zero(zero, ranks, stage, home, single_step):
    missing = ZERO_FIELDS - zero.keys()
    assert not missing, f"zero fields missing: {missing}"
    assert zero["ranks"] == ranks and zero["stage"] == stage, zero
    assert zero["backend"] == "gloo" and zero["state_home"] == home, zero
    assert zero["bucket_bytes"] > 0 and zero["gradient_buckets"] >= 1, zero
    # The layout: every group padded to a multiple of ranks x alignment, equal shards.
    unit = ranks * zero["alignment"]
    padded, groups = zero["padded_params"], zero["groups"]
    assert groups >= 1 and padded % unit == 0, zero
    assert PARAMS <= padded < PARAMS + groups * unit, zero
    assert zero["shard_params"] * ranks == padded, zero
    # ideal = single / N, ratio = ideal / step; each sample is its slowest rank's.
    assert zero["single_step_seconds"] == single_step, (zero, single_step)
    assert close(zero["ideal_seconds"], single_step / ranks), zero
    assert close(zero["ratio"], zero["ideal_seconds"] / zero["step_seconds"], rel=5e-3,
                 abs_tol=1e-4), zero
    steps = zero["all_step_seconds"]
    assert len(steps) == REPEAT and all(s > 0 for s in steps), zero
    assert zero["step_seconds"] == sorted(steps)[(REPEAT - 1) // 2], zero
    per_rank = zero["per_rank"]
    assert [r["rank"] for r in per_rank] == list(range(ranks)), per_rank
    for s in range(REPEAT):
        assert steps[s] == max(r["all_step_seconds"][s] for r in per_rank), (s, zero)
    slowest = zero["slowest_rank"]
    assert 0 <= slowest < ranks, zero
    assert zero["step_seconds"] in per_rank[slowest]["all_step_seconds"], zero
    check_sample(zero, "zero", ranks)
    # Communication per step: a reduce-scatter and an all-gather of every padded group (2 bytes
    # an element each way), plus the statistics all-reduce (small); nothing on one rank.
    comm = zero["comm_bytes"]
    assert set(comm) == {"reduce_scatter", "all_gather", "all_reduce"}, comm
    assert comm["reduce_scatter"] == padded * DTYPE_BYTES, (comm, padded)
    assert comm["all_gather"] == padded * DTYPE_BYTES, (comm, padded)
    assert 0 < comm["all_reduce"] <= 64, comm
    assert zero["comm_bytes_per_step"] == sum(comm.values()), zero
    # The engine counts the same bytes (from the end of one step to the end of the next).
    assert zero["engine_comm_bytes_per_step"] == zero["comm_bytes_per_step"], zero
    shard = zero["shard_params"]
    for r in per_rank:
        where = f"zero.per_rank[{r.get('rank')}]"
        missing = RANK_FIELDS - r.keys()
        assert not missing, f"{where}: fields missing: {missing}"
        assert len(r["all_step_seconds"]) == REPEAT, r
        assert r["step_seconds"] == sorted(r["all_step_seconds"])[(REPEAT - 1) // 2], r
        check_sample(r, where, ranks)
        assert r["comm_bytes_per_step"] == zero["comm_bytes_per_step"], (r, zero)
        tiers = r["model_state_bytes_by_tier"]
        assert set(tiers) == {"gpu", "cpu", "nvme"}, tiers
        assert r["model_state_bytes"] == sum(tiers.values()), r
        # The optimizer states of this rank's slice (12 bytes a parameter) in their tier.
        assert tiers[home] >= 12 * shard, (r, shard)
        if home == "cpu":
            assert tiers["nvme"] == 0, r
            # The ZeRO formulas (2-byte parameters and gradients, K = 12), padding included:
            # stage 1 4P + 12P/N, stage 2 2P + 14P/N; within 5% plus the store's page rounding.
            # (On NVMe the swap space holds two slots of whole chunks: more than K.)
            expect = 4 * padded + 12 * shard if stage == 1 else 2 * padded + 14 * shard
            assert abs(r["model_state_bytes"] - expect) <= 0.05 * expect + 64 * 4096, (r, expect)
        if stage == 1:
            assert r["bucket_bytes"] == 0, r


def main() -> int:
    strata_run, bench, ranks, stage = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    launcher = [] if strata_run == "-" else [strata_run, "-n", str(ranks)]
    with tempfile.TemporaryDirectory(prefix="offload-bench-zero-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        for name in ("STRATA_NVME_PATHS", "STRATA_NVME_BYTES", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                     "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        nvme_dir = os.path.join(tmpdir, "nvme")
        if mode == "nvme":
            os.mkdir(nvme_dir)
            env["STRATA_NVME_PATHS"] = nvme_dir
        args = [*launcher, bench, "--workload=optimizer", f"--params={PARAMS}",
                f"--repeat={REPEAT}", "--json=-"]
        # Under strata-run the stage is its default (2) unless asked; alone it must be given.
        if strata_run == "-" or stage != 2:
            args.append(f"--zero-stage={stage}")
        run = subprocess.run(args, capture_output=True, text=True, env=env, timeout=240)
        if run.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {run.returncode}:\n{run.stderr}")
        left = sorted(os.listdir(tmpdir))
        assert left == (["nvme"] if mode == "nvme" else []), f"left in TMPDIR={tmpdir}: {left}"
        if mode == "nvme":
            assert not os.listdir(nvme_dir), f"left in {nvme_dir}: {os.listdir(nvme_dir)}"
    doc = json.loads(run.stdout)  # fails if another rank also wrote to stdout
    missing = {"version", "backend", "device", "config", "results", "optimizer"} - doc.keys()
    assert not missing, f"top-level fields missing: {missing}"
    missing = CONFIG_FIELDS - doc["config"].keys()
    assert not missing, f"config fields missing: {missing}"
    assert doc["results"] == [], doc["results"]
    opt = doc["optimizer"]
    missing = OPTIMIZER_FIELDS - opt.keys()
    assert not missing, f"optimizer fields missing: {missing}"
    assert opt["params"] == PARAMS and opt["dtype"] == "fp16" and opt["repeat"] == REPEAT, opt
    assert opt["bytes_per_param"] == 28 and opt["tensors"] == 1, opt
    assert len(opt["all_step_seconds"]) == REPEAT, opt
    assert opt["step_seconds"] == sorted(opt["all_step_seconds"])[(REPEAT - 1) // 2], opt
    check_stats(opt["stats"], "optimizer")
    check_zero(opt["zero"], ranks, stage, "cpu", opt["step_seconds"])
    if mode == "nvme":
        nvme = opt.get("nvme")
        assert nvme is not None, "STRATA_NVME_PATHS is set but the document has no optimizer.nvme"
        assert nvme["paths"] == [nvme_dir] and nvme["engine"] in ("io_uring", "psync"), nvme
        assert nvme["step_seconds"] == sorted(nvme["all_step_seconds"])[(REPEAT - 1) // 2], nvme
        check_stats(nvme["stats"], "optimizer.nvme")
        check_zero(nvme["zero"], ranks, stage, "nvme", nvme["step_seconds"])
    else:
        assert "nvme" not in opt, "no NVMe tier is configured but optimizer.nvme is present"
    rank_lines = [line for line in run.stderr.splitlines() if line.startswith("rank ")]
    homes = 2 if mode == "nvme" else 1
    assert len(rank_lines) == ranks * homes, run.stderr  # rank 0 prints, one line per rank
    zero = opt["zero"]
    print(f"offload-bench optimizer ZeRO JSON ok ({ranks} ranks, stage {stage}, {mode}): step "
          f"{zero['step_seconds']} s, ideal {zero['ideal_seconds']} s (ratio {zero['ratio']}), "
          f"exposed comm {zero['exposed_comm_seconds']} s, {zero['comm_bytes_per_step']} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
