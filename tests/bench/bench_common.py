"""Shared by the offload-bench tests: run the bench, check its JSON document."""
import json
import subprocess

ALL_PATHS = ["cpu-gpu", "gpu-cpu", "cpu-nvme", "nvme-cpu", "gpu-nvme", "nvme-gpu"]
ROW_FIELDS = {"path", "tensor_bytes", "total_bytes", "repeats", "gbps_median", "gbps_min",
              "gbps_max", "baseline_gbps", "baseline_bytes", "ratio"}
CONFIG_FIELDS = {"gpu_bytes", "cpu_bytes", "io_engine", "engine", "engine_reason", "io_block",
                 "io_depth", "verify", "nvme_paths"}


def run_bench(bench, args, env):
    """Runs offload-bench with --json=- and returns the parsed document (stdout must be exactly
    the JSON document; the human output goes to stderr)."""
    run = subprocess.run([bench, *args, "--json=-"], capture_output=True, text=True, env=env,
                         timeout=300)
    if run.returncode != 0:
        raise AssertionError(f"offload-bench exited {run.returncode}:\n{run.stderr}")
    return json.loads(run.stdout)


def check_document(doc, paths, total, tensor, repeats):
    missing = {"version", "backend", "device", "config", "results"} - doc.keys()
    assert not missing, f"top-level fields missing: {missing}"
    missing = CONFIG_FIELDS - doc["config"].keys()
    assert not missing, f"config fields missing: {missing}"
    assert doc["config"]["engine"] in ("io_uring", "psync"), doc["config"]
    got = [row["path"] for row in doc["results"]]
    assert got == paths, got
    for row in doc["results"]:
        missing = ROW_FIELDS - row.keys()
        assert not missing, f"{row['path']}: fields missing: {missing}"
        assert row["total_bytes"] == total and row["tensor_bytes"] == tensor, row
        assert row["repeats"] == repeats, row
        assert row["baseline_bytes"] == row["total_bytes"], "baseline moved other bytes"
        assert 0 < row["gbps_min"] <= row["gbps_median"] <= row["gbps_max"], row
        assert row["baseline_gbps"] > 0, row
        # The JSON prints each figure to 3 decimals: the ratio of the printed rates may differ
        # from the printed ratio by their rounding, relative to each rate (a slow baseline under
        # TSan, 0.395 GB/s against 4.92, put 0.011 between them).
        med, base = row["gbps_median"], row["baseline_gbps"]
        slack = 0.0005 + (med / base) * (0.0005 / med + 0.0005 / base) + 1e-9
        assert abs(row["ratio"] - med / base) <= slack, (row, slack)
