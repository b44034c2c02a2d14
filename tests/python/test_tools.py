"""strata-info and strata-run as the pip install runs them (strata/_tools.py), and
`python -m strata`. Under python.pytest the package is the build tree's, whose tools are
<build>/tools/; under python.pip_install it is a venv's, whose tools are strata/bin/."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import strata._tools as tools


def stable(text):
    # Figures that move between two runs (available memory, free space).
    return re.sub(r"[0-9][0-9.,]*\s*(B|KiB|MiB|GiB|TiB|%)\b", "N", text)


def test_python_m_strata_prints_what_strata_info_prints():
    env = dict(os.environ, STRATA_BACKEND="host")
    info = subprocess.run([tools.binary("strata-info")], env=env, stdout=subprocess.PIPE,
                          text=True, check=True).stdout
    via_python = subprocess.run([sys.executable, "-m", "strata"], env=env,
                                stdout=subprocess.PIPE, text=True, check=True).stdout
    assert "Configuration" in info
    assert stable(via_python) == stable(info)


def test_flags_reach_strata_info():
    result = subprocess.run([sys.executable, "-m", "strata", "--no-such-flag"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 2
    assert "--no-such-flag" in result.stderr


def test_a_missing_binary_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tools, "_PACKAGE", str(tmp_path / "site-packages" / "strata"))
    with pytest.raises(FileNotFoundError, match=r"strata-run is not where .*bin/strata-run"):
        tools.binary("strata-run")
    monkeypatch.setattr(sys, "argv", ["strata-run", "-n", "2", "true"])
    with pytest.raises(SystemExit) as exit_info:
        tools.strata_run()
    assert exit_info.value.code == 1
    assert "Reinstall strata with pip" in capsys.readouterr().err



def test_a_wrapper_script_is_not_taken_for_the_tool(tmp_path, monkeypatch):
    # A venv's bin/strata-info is the console-script wrapper (4 levels above the package, where a
    # `cmake --install` prefix has its bin/): exec'ing it would run this code again, forever.
    real = tools.binary("strata-info")
    package = tmp_path / "lib" / "python3.11" / "site-packages" / "strata"
    package.mkdir(parents=True)
    wrapper = tmp_path / "bin" / "strata-info"
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/sh\nexit 0\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(tools, "_PACKAGE", str(package))
    with pytest.raises(FileNotFoundError, match="strata-info is not where"):
        tools.binary("strata-info")
    # A `cmake --install` prefix's bin/ holds the binary itself: that one is taken.
    shutil.copy(real, wrapper)
    assert tools.binary("strata-info") == str(wrapper)
