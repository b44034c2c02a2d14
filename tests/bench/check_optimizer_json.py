#!/usr/bin/env python3
"""Runs offload-bench --workload=optimizer (small: --params=1M --repeat=2) with --json=- in a
fresh TMPDIR and checks every field of the document's "optimizer" object.

  check_optimizer_json.py BENCH cpu [DTYPE]   no NVMe tier: "nvme" must be absent
  check_optimizer_json.py BENCH nvme          STRATA_NVME_PATHS set to a temporary directory:
                                              "nvme" present, the directory empty afterwards

No timing assertions (the machine may be busy): times must be positive and the ratios must be
the documented quotients of the reported times."""
import math
import os
import sys
import tempfile

from bench_common import CONFIG_FIELDS, run_bench

PARAMS, REPEAT = 1_000_000, 2
OPTIMIZER_FIELDS = {"params", "dtype", "bytes_per_param", "tensors", "repeat", "isa", "threads",
                    "floor_seconds", "triad_gbps", "triad_bytes", "triad_bytes_per_element",
                    "in_place_gbps", "in_place_floor_seconds", "ratio_to_in_place_floor",
                    "step_seconds", "ratio_to_floor", "params_per_second", "all_step_seconds",
                    "stats", "naive_seconds", "naive_measured_params", "naive_measured_seconds"}
STATS_FIELDS = {"last_step_ns", "last_step_wait_ns", "last_adam_ns", "last_nvme_wait_ns",
                "peak_staging_chunks", "chunk_elements", "chunks", "nvme_bytes_read",
                "nvme_bytes_written"}
NVME_FIELDS = {"bound_seconds", "step_seconds", "ratio_to_bound", "overlapped_bound_seconds",
               "read_gbps", "write_gbps", "state_bytes", "paths", "engine", "all_step_seconds",
               "stats"}
BYTES_PER_PARAM = {"fp16": 28, "bf16": 28, "fp32": 32}


def close(a, b, rel=2e-3, abs_tol=2e-6):
    """The JSON rounds seconds to 1e-6 and ratios to 1e-4."""
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def check_stats(stats, where):
    missing = STATS_FIELDS - stats.keys()
    assert not missing, f"{where}.stats fields missing: {missing}"
    assert all(isinstance(stats[k], int) and stats[k] >= 0 for k in STATS_FIELDS), stats
    assert stats["last_step_ns"] > 0 and stats["last_adam_ns"] > 0, stats
    assert stats["last_adam_ns"] <= stats["last_step_ns"], stats
    assert stats["chunk_elements"] > 0, stats


def check_steps(obj, where):
    assert len(obj["all_step_seconds"]) == REPEAT, obj["all_step_seconds"]
    assert all(s > 0 for s in obj["all_step_seconds"]), obj["all_step_seconds"]
    # The median of an even count is the lower middle step, one of the steps itself.
    assert obj["step_seconds"] == sorted(obj["all_step_seconds"])[(REPEAT - 1) // 2], obj
    assert obj["step_seconds"] > 0, f"{where}: {obj}"


def check_optimizer(opt, dtype):
    missing = OPTIMIZER_FIELDS - opt.keys()
    assert not missing, f"optimizer fields missing: {missing}"
    assert opt["params"] == PARAMS and opt["dtype"] == dtype and opt["repeat"] == REPEAT, opt
    assert opt["bytes_per_param"] == BYTES_PER_PARAM[dtype], opt
    assert opt["tensors"] == 1, opt
    assert opt["isa"] in ("avx512", "avx2", "scalar"), opt
    assert opt["threads"] >= 1, opt
    # floor = bytes per param x params / triad bandwidth, and ratio = floor / step.
    assert opt["triad_gbps"] > 0 and opt["floor_seconds"] > 0, opt
    assert opt["triad_bytes_per_element"] in (12, 16), opt
    assert opt["triad_bytes"] == opt["triad_bytes_per_element"] * PARAMS, opt
    assert close(opt["floor_seconds"],
                 opt["bytes_per_param"] * PARAMS / (opt["triad_gbps"] * 1e9)), opt
    assert close(opt["in_place_floor_seconds"],
                 opt["bytes_per_param"] * PARAMS / (opt["in_place_gbps"] * 1e9)), opt
    check_steps(opt, "optimizer")
    assert close(opt["ratio_to_floor"], opt["floor_seconds"] / opt["step_seconds"], rel=5e-3), opt
    assert close(opt["ratio_to_in_place_floor"],
                 opt["in_place_floor_seconds"] / opt["step_seconds"], rel=5e-3), opt
    assert close(opt["params_per_second"], PARAMS / opt["step_seconds"], rel=5e-3), opt
    check_stats(opt["stats"], "optimizer")
    assert opt["stats"]["last_nvme_wait_ns"] == 0, "states in the CPU tier waited for NVMe"
    assert opt["stats"]["nvme_bytes_read"] == 0 and opt["stats"]["nvme_bytes_written"] == 0, opt
    # The naive loop: measured on every parameter here (1M is below the subset size).
    assert opt["naive_measured_params"] == PARAMS, opt
    assert opt["naive_seconds"] > 0 and opt["naive_measured_seconds"] > 0, opt
    assert close(opt["naive_seconds"],
                 opt["naive_measured_seconds"] * PARAMS / opt["naive_measured_params"]), opt


def check_nvme(nvme, nvme_dir):
    missing = NVME_FIELDS - nvme.keys()
    assert not missing, f"optimizer.nvme fields missing: {missing}"
    assert nvme["paths"] == [nvme_dir], nvme
    assert nvme["engine"] in ("io_uring", "psync"), nvme
    assert nvme["state_bytes"] == 12 * PARAMS, nvme
    check_steps(nvme, "optimizer.nvme")
    check_stats(nvme["stats"], "optimizer.nvme")
    # Every step reads and writes at least the whole state (master, m, v).
    assert nvme["stats"]["nvme_bytes_read"] >= nvme["state_bytes"], nvme
    assert nvme["stats"]["nvme_bytes_written"] >= nvme["state_bytes"], nvme
    if nvme["bound_seconds"] is None:  # io_uring refused here: no raw baseline
        assert nvme["read_gbps"] is None and nvme["ratio_to_bound"] is None, nvme
        assert nvme["overlapped_bound_seconds"] is None, nvme
        return
    assert nvme["read_gbps"] > 0 and nvme["write_gbps"] > 0, nvme
    bound = (nvme["state_bytes"] / (nvme["read_gbps"] * 1e9) +
             nvme["state_bytes"] / (nvme["write_gbps"] * 1e9))
    assert close(nvme["bound_seconds"], bound), nvme
    overlapped = max(nvme["state_bytes"] / (nvme["read_gbps"] * 1e9),
                     nvme["state_bytes"] / (nvme["write_gbps"] * 1e9))
    assert close(nvme["overlapped_bound_seconds"], overlapped), nvme
    assert close(nvme["ratio_to_bound"], nvme["bound_seconds"] / nvme["step_seconds"],
                 rel=5e-3), nvme


def main() -> int:
    bench, mode = sys.argv[1], sys.argv[2]
    dtype = sys.argv[3] if len(sys.argv) > 3 else "fp16"
    with tempfile.TemporaryDirectory(prefix="offload-bench-opt-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("STRATA_NVME_PATHS", None)
        env.pop("STRATA_NVME_BYTES", None)
        nvme_dir = os.path.join(tmpdir, "nvme")
        if mode == "nvme":
            os.mkdir(nvme_dir)
            env["STRATA_NVME_PATHS"] = nvme_dir
        doc = run_bench(bench, ["--workload=optimizer", f"--params={PARAMS}",
                                f"--repeat={REPEAT}", f"--dtype={dtype}"], env)
        left = sorted(os.listdir(tmpdir))
        assert left == (["nvme"] if mode == "nvme" else []), f"left in TMPDIR={tmpdir}: {left}"
        if mode == "nvme":
            assert not os.listdir(nvme_dir), f"left in {nvme_dir}: {os.listdir(nvme_dir)}"

    missing = {"version", "backend", "device", "config", "results", "optimizer"} - doc.keys()
    assert not missing, f"top-level fields missing: {missing}"
    missing = CONFIG_FIELDS - doc["config"].keys()
    assert not missing, f"config fields missing: {missing}"
    assert doc["results"] == [], "the path rows are for --workload=swap"
    opt = doc["optimizer"]
    check_optimizer(opt, dtype)
    if mode == "nvme":
        assert "nvme" in opt, "STRATA_NVME_PATHS is set but the document has no optimizer.nvme"
        assert doc["config"]["nvme_paths"] == [nvme_dir], doc["config"]
        check_nvme(opt["nvme"], nvme_dir)
    else:
        assert "nvme" not in opt, "no NVMe tier is configured but optimizer.nvme is present"
        assert doc["config"]["nvme_paths"] == [], doc["config"]
    print(f"offload-bench optimizer JSON ok ({mode}, {dtype}): step {opt['step_seconds']} s, "
          f"floor {opt['floor_seconds']} s (ratio {opt['ratio_to_floor']}), naive "
          f"{opt['naive_seconds']} s" +
          (f"; nvme step {opt['nvme']['step_seconds']} s, bound {opt['nvme']['bound_seconds']} s"
           if mode == "nvme" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
