#!/usr/bin/env python3
"""Runs offload-bench with --json=- and checks the document: it parses, every row has every
field, the runtime and the baseline moved the same bytes, and the figures are sane."""
import json
import subprocess
import sys

ROW_FIELDS = {"path", "tensor_bytes", "total_bytes", "repeats", "gbps_median", "gbps_min",
              "gbps_max", "baseline_gbps", "ratio"}


def main() -> int:
    bench = sys.argv[1]
    run = subprocess.run([bench, "--bytes=8MiB", "--tensor-bytes=1MiB", "--repeat=3", "--json=-"],
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        print(f"offload-bench exited {run.returncode}:\n{run.stderr}")
        return 1
    doc = json.loads(run.stdout)  # stdout must be exactly the JSON document
    missing = {"version", "backend", "device", "config", "results"} - doc.keys()
    assert not missing, f"top-level fields missing: {missing}"
    assert doc["backend"] in ("host", "cuda"), doc["backend"]
    paths = [row["path"] for row in doc["results"]]
    assert paths == ["cpu-gpu", "gpu-cpu"], paths
    for row in doc["results"]:
        missing = ROW_FIELDS - row.keys()
        assert not missing, f"{row['path']}: fields missing: {missing}"
        assert row["total_bytes"] == 8 << 20 and row["tensor_bytes"] == 1 << 20, row
        assert row["repeats"] == 3, row
        assert row["baseline_bytes"] == row["total_bytes"], "baseline moved other bytes"
        assert 0 < row["gbps_min"] <= row["gbps_median"] <= row["gbps_max"], row
        assert row["baseline_gbps"] > 0, row
        assert abs(row["ratio"] - row["gbps_median"] / row["baseline_gbps"]) < 0.01, row
    print("offload-bench JSON ok:", ", ".join(f"{r['path']} {r['gbps_median']} GB/s"
                                                 for r in doc["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
