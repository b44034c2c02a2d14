#!/usr/bin/env python3
"""offload-bench's NVMe paths leave nothing behind.

  check_bench_nvme.py BENCH temp      STRATA_NVME_PATHS unset: a temporary directory under a
                                      fresh TMPDIR, gone afterwards
  check_bench_nvme.py BENCH paths     STRATA_NVME_PATHS = two fresh directories: both rows, both
                                      directories empty afterwards
  check_bench_nvme.py BENCH sigkill   SIGKILL once the swap file is open: the directories hold
                                      nothing (the files are O_TMPFILE); with TMPDIR, the
                                      temporary directory is gone too (its reaper removes it)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

from bench_common import check_document, run_bench

NVME = ["cpu-nvme", "nvme-cpu"]


def base_env():
    env = dict(os.environ)
    env.pop("STRATA_NVME_PATHS", None)
    return env


def check_temp(bench):
    with tempfile.TemporaryDirectory(prefix="offload-bench-test-") as tmpdir:
        env = dict(base_env(), TMPDIR=tmpdir)
        doc = run_bench(bench, ["--paths=cpu-nvme,nvme-cpu", "--bytes=8MiB", "--repeat=2"], env)
        check_document(doc, NVME, total=8 << 20, tensor=8 << 20, repeats=2)
        [path] = doc["config"]["nvme_paths"]
        assert path.startswith(tmpdir + "/strata-bench-"), path
        left = os.listdir(tmpdir)
        assert not left, f"left behind in TMPDIR: {left}"
    return "temporary directory removed"


def check_paths(bench):
    with tempfile.TemporaryDirectory(prefix="offload-bench-test-") as root:
        dirs = [os.path.join(root, name) for name in ("a", "b")]
        for d in dirs:
            os.mkdir(d)
        env = dict(base_env(), STRATA_NVME_PATHS=",".join(dirs))
        doc = run_bench(bench, ["--paths=nvme-cpu,cpu-nvme", "--bytes=8MiB",
                                "--tensor-bytes=2MiB", "--repeat=2"], env)
        check_document(doc, NVME, total=8 << 20, tensor=2 << 20, repeats=2)
        assert doc["config"]["nvme_paths"] == dirs, doc["config"]
        for d in dirs:
            assert not os.listdir(d), f"left behind in {d}: {os.listdir(d)}"
    return "both directories empty"


def open_files_under(pid, prefixes):
    found = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if any(target.startswith(p + "/") for p in prefixes):
                found.append(target)
    except OSError:
        pass
    return found


def kill_once_open(bench, env, watch):
    """Starts a long NVMe run, SIGKILLs it once it has a file open under one of `watch`."""
    proc = subprocess.Popen([bench, "--paths=cpu-nvme,nvme-cpu", "--bytes=128MiB",
                             "--tensor-bytes=16MiB", "--repeat=1000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 60
        files = []
        while not files and time.monotonic() < deadline and proc.poll() is None:
            files = open_files_under(proc.pid, watch())
            time.sleep(0.01)
        assert proc.poll() is None, f"offload-bench ended (exit {proc.returncode}) before the kill"
        assert files, "offload-bench never opened a file in the NVMe directories"
        time.sleep(0.2)  # well into the timed passes
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        return files
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def check_sigkill(bench):
    with tempfile.TemporaryDirectory(prefix="offload-bench-test-") as root:
        dirs = [os.path.join(root, name) for name in ("a", "b")]
        for d in dirs:
            os.mkdir(d)
        env = dict(base_env(), STRATA_NVME_PATHS=",".join(dirs))
        files = kill_once_open(bench, env, lambda: dirs)
        for d in dirs:
            assert not os.listdir(d), f"left behind in {d} after SIGKILL: {os.listdir(d)}"

        # Without STRATA_NVME_PATHS the temporary directory was empty (O_TMPFILE files) and
        # its reaper removes it once the bench is gone. The reaper runs after the kill, so the
        # check waits for it (a bound, not a timing assertion).
        tmpdir = os.path.join(root, "tmp")
        os.mkdir(tmpdir)
        env = dict(base_env(), TMPDIR=tmpdir)
        temp_files = kill_once_open(
            bench, env, lambda: [os.path.join(tmpdir, n) for n in os.listdir(tmpdir)])
        assert any("/strata-bench-" in f for f in temp_files), temp_files
        deadline = time.monotonic() + 30
        while os.listdir(tmpdir) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in os.listdir(tmpdir):
            inside = os.listdir(os.path.join(tmpdir, name))
            assert name.startswith("strata-bench-") and not inside, (name, inside)
        left = os.listdir(tmpdir)
        assert not left, f"left behind in TMPDIR after SIGKILL: {left}"
    return f"nothing left after SIGKILL (had open: {', '.join(sorted(set(files)))})"


def main() -> int:
    bench, mode = sys.argv[1], sys.argv[2]
    checks = {"temp": check_temp, "paths": check_paths, "sigkill": check_sigkill}
    print(f"offload-bench NVMe {mode} ok:", checks[mode](bench))
    return 0


if __name__ == "__main__":
    sys.exit(main())
