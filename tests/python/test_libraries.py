"""Importing strata adds torch's NCCL wheel (nvidia/nccl/lib on sys.path) to
STRATA_NCCL_SEARCH_PATH without importing torch; strata's C++ loader searches it (docs/comm.md)."""

import os
import subprocess
import sys


def _import_strata(tmp_path, env_value=None):
    site = tmp_path / "site"
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")  # found by name only; never loaded here
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(site)])
    env.pop("STRATA_NCCL_SEARCH_PATH", None)
    if env_value is not None:
        env["STRATA_NCCL_SEARCH_PATH"] = env_value
    code = ("import os, sys, strata; "
            "print(os.environ.get('STRATA_NCCL_SEARCH_PATH', '')); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    return out, str(lib)


def test_torch_nccl_wheel_is_added_to_the_search_path(tmp_path):
    (search_path, torch_imported), lib = _import_strata(tmp_path)
    assert search_path.split(":") == [lib]
    assert torch_imported == "False"


def test_a_search_path_the_user_set_comes_first(tmp_path):
    (search_path, _), lib = _import_strata(tmp_path, "/opt/my-nccl/lib")
    assert search_path.split(":") == ["/opt/my-nccl/lib", lib]
