#!/usr/bin/env python3
"""Runs offload-bench with its default paths and --json=- and checks the document: it parses,
every row has every field, the runtime and the baseline moved the same bytes, the figures are
sane, and the NVMe paths' temporary directory (under a fresh TMPDIR) is gone afterwards."""
import os
import sys
import tempfile

from bench_common import ALL_PATHS, check_document, run_bench


def main() -> int:
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="offload-bench-test-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("STRATA_NVME_PATHS", None)
        doc = run_bench(bench, ["--bytes=8MiB", "--tensor-bytes=1MiB", "--repeat=3"], env)
        check_document(doc, ALL_PATHS, total=8 << 20, tensor=1 << 20, repeats=3)
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
