#!/usr/bin/env python3
"""offload-bench's sweep and outputs, each run small and under a fresh TMPDIR that must be empty
afterwards (no timing assertions):

  check_bench_outputs.py BENCH nvme    --paths=cpu-nvme --bytes=8MiB runs, one complete row
  check_bench_outputs.py BENCH sweep   --tensor-bytes=1MiB,4MiB --paths=cpu-gpu,nvme-gpu: 4 rows
  check_bench_outputs.py BENCH csv     --csv=-: a header and one line per row, same as the JSON
  check_bench_outputs.py BENCH svg     --svg=FILE: well-formed XML, one polyline per path
  check_bench_outputs.py BENCH tune    --tune with tiny --bytes prints an export line
"""
import csv
import io
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

from bench_common import ROW_FIELDS, check_document, run_bench

SWEEP = ["--tensor-bytes=1MiB,4MiB", "--paths=cpu-gpu,nvme-gpu", "--bytes=8MiB", "--repeat=2"]


def run_plain(bench, args, env):
    run = subprocess.run([bench, *args], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, f"offload-bench {args} exited {run.returncode}:\n{run.stderr}"
    return run


def check_nvme(bench, env, _):
    doc = run_bench(bench, ["--paths=cpu-nvme", "--bytes=8MiB", "--repeat=2"], env)
    check_document(doc, ["cpu-nvme"], total=8 << 20, tensor=8 << 20, repeats=2)
    return "one cpu-nvme row"


def check_sweep(bench, env, _):
    doc = run_bench(bench, SWEEP, env)
    rows = doc["results"]
    assert len(rows) == 4, rows
    got = sorted((r["tensor_bytes"], r["path"]) for r in rows)
    assert got == [(1 << 20, "cpu-gpu"), (1 << 20, "nvme-gpu"), (4 << 20, "cpu-gpu"),
                   (4 << 20, "nvme-gpu")], got
    for size in (1 << 20, 4 << 20):
        check_document(dict(doc, results=[r for r in rows if r["tensor_bytes"] == size]),
                       ["cpu-gpu", "nvme-gpu"], total=8 << 20, tensor=size, repeats=2)
    return "4 rows"


def check_csv(bench, env, _):
    out = run_plain(bench, [*SWEEP, "--csv=-"], env).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    assert out.splitlines()[0].split(",") == [
        "path", "tensor_bytes", "total_bytes", "repeats", "gbps_median", "gbps_min", "gbps_max",
        "baseline_gbps", "baseline_bytes", "ratio"], out.splitlines()[0]
    assert set(rows[0].keys()) == ROW_FIELDS, rows[0].keys()
    assert len(rows) == 4 and len(out.splitlines()) == 5, out
    for row in rows:
        assert row["baseline_bytes"] == row["total_bytes"], row
        assert float(row["gbps_median"]) > 0, row
    return "header + 4 lines"


def check_svg(bench, env, tmpdir):
    with tempfile.TemporaryDirectory(prefix="offload-bench-svg-") as outdir:
        path = os.path.join(outdir, "plot.svg")
        run_plain(bench, [*SWEEP, f"--svg={path}"], env)
        root = ET.parse(path).getroot()
        ns = "{http://www.w3.org/2000/svg}"
        assert root.tag == ns + "svg", root.tag
        series = [p.get("data-path") for p in root.iter(ns + "polyline")]
        assert sorted(series) == ["cpu-gpu", "nvme-gpu"], series
        for p in root.iter(ns + "polyline"):
            assert len(p.get("points").split()) == 2, p.get("points")
        texts = " ".join(t.text or "" for t in root.iter(ns + "text"))
        assert "tensor size" in texts and "GB/s" in texts, texts
    return "well-formed, one polyline per path"


def check_tune(bench, env, _):
    out = run_plain(bench, ["--tune", "--bytes=1MiB", "--tensor-bytes=256KiB", "--repeat=1"],
                    env).stdout
    last = out.strip().splitlines()[-1]
    assert last.startswith("export STRATA_IO_BLOCK="), out
    assert "STRATA_IO_DEPTH=" in last and "STRATA_IO_ENGINE=" in last, last
    return last


def main() -> int:
    bench, mode = sys.argv[1], sys.argv[2]
    checks = {"nvme": check_nvme, "sweep": check_sweep, "csv": check_csv, "svg": check_svg,
              "tune": check_tune}
    with tempfile.TemporaryDirectory(prefix="offload-bench-test-") as tmpdir:
        env = dict(os.environ, TMPDIR=tmpdir)
        env.pop("STRATA_NVME_PATHS", None)
        result = checks[mode](bench, env, tmpdir)
        left = os.listdir(tmpdir)
        assert not left, f"offload-bench left {left} in TMPDIR={tmpdir}"
    print(f"offload-bench {mode} ok:", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
