#!/usr/bin/env python3
"""Runs offload-bench with its default paths and --json=- and checks the document: it parses,
every row has every field, the runtime and the baseline moved the same bytes, the figures are
sane, the NVMe rows report their staging and reads in flight, and the NVMe paths' temporary
directory (under a fresh TMPDIR) is gone afterwards."""
import os
import sys
import tempfile

from bench_common import ALL_PATHS, check_document, run_bench


STAGING_FIELDS = {"bytes", "chunk_bytes", "peak_leases", "peak_bytes", "waits", "wait_seconds"}


def check_nvme_use(doc):
    """The NVMe rows report the staging pool and the reads in flight over their runtime passes;
    the GPU rows (no NVMe tier) report none."""
    for row in doc["results"]:
        staging = row["staging"]
        if row["path"] in ("cpu-gpu", "gpu-cpu"):
            assert staging is None and row["fetches_in_flight_peak"] is None, row
            continue
        assert set(staging) == STAGING_FIELDS, row
        assert 0 < staging["chunk_bytes"] <= staging["bytes"], row
        assert staging["peak_bytes"] <= staging["bytes"], row
        assert staging["peak_leases"] * 4096 <= staging["peak_bytes"], row
        assert staging["waits"] >= 0 and staging["wait_seconds"] >= 0, row
        # Only the staged paths lease staging; the reads are nvme-cpu's and nvme-gpu's.
        staged = row["path"] in ("gpu-nvme", "nvme-gpu")
        assert (staging["peak_leases"] > 0) == staged, row
        reads = row["fetches_in_flight_peak"]
        assert (reads > 0) == (row["path"] in ("nvme-cpu", "nvme-gpu")), row
        assert reads <= row["total_bytes"] // row["tensor_bytes"], row


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="offload-bench-test-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("STRATA_NVME_PATHS", None)
        doc = run_bench(bench, ["--bytes=8MiB", "--tensor-bytes=1MiB", "--repeat=3"], env)
        check_document(doc, ALL_PATHS, total=8 << 20, tensor=1 << 20, repeats=3)
        check_nvme_use(doc)
        assert doc["backend"] in ("host", "cuda"), doc["backend"]
        assert len(doc["config"]["nvme_paths"]) == 1, doc["config"]
        assert doc["config"]["nvme_paths"][0].startswith(tmpdir + "/strata-bench-"), doc["config"]
        left = os.listdir(tmpdir)
        assert not left, f"offload-bench left {left} in TMPDIR={tmpdir}"
    print("offload-bench JSON ok:", ", ".join(f"{r['path']} {r['gbps_median']} GB/s"
                                                 for r in doc["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
