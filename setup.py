"""The pip build of strata (pyproject.toml): a setuptools build_ext that runs CMake.

    pip install --no-build-isolation .      # in a venv; `pip wheel --no-build-isolation .` too

CMake builds, for the interpreter running pip (sys.executable), in Release and without tests,
only what the wheel holds: the module strata._strata, strata-info and strata-run. Then
`cmake --install --component python` puts the module, the pure-Python files and the two tools
(strata/bin/) into setuptools' build folder, which becomes the wheel. The CMake build folder is
build-pip/<interpreter's extension suffix>/ in the source tree and is kept: a second `pip install`
or `pip wheel` of the same tree for the same interpreter rebuilds only what changed.

A CUDA build needs NCCL's header (the CUDA toolkit's, or torch's nvidia-nccl-cuXX wheel installed
in this interpreter): without it the configure step fails, naming the wheel, unless NCCL is left out
on purpose (CMAKE_ARGS=-DSTRATA_WITH_NCCL=OFF).

As scikit-build-core does: CMAKE_ARGS (extra CMake arguments, e.g. "-DSTRATA_WITH_CUDA=OFF"),
CMAKE_BUILD_PARALLEL_LEVEL (jobs) and CMAKE_GENERATOR are honoured. setuptools is the backend only
because Debian 12 does not package scikit-build-core (pyproject.toml).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_BASE = "build-pip"
DEBIAN_PACKAGES = "cmake python3-dev pybind11-dev (or: make deps, which runs tools/install-deps.sh)"


def cmake_version():
    """project(strata VERSION x.y.z) in CMakeLists.txt: the one place the version is written."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(\s*strata\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not match:
        sys.exit("strata: setup.py: no project(strata VERSION x.y.z) in CMakeLists.txt")
    return match.group(1)


def fail(message):
    # One line a user can act on, instead of a traceback from deep inside setuptools.
    sys.exit(f"strata: cannot build the Python package: {message}")


class CMakeBuild(build_ext):
    """Builds every extension of the distribution (the one placeholder below) with CMake."""

    def run(self):
        if self.inplace:
            fail("editable installs (pip install -e) are not supported; for development build "
                 "with CMake and use PYTHONPATH=<build>/python (docs/python.md)")
        cmake = shutil.which("cmake")
        if cmake is None:
            fail(f"cmake is not on PATH. Debian: apt install {DEBIAN_PACKAGES}")
        include = sysconfig.get_paths()["include"]
        if not os.path.exists(os.path.join(include, "Python.h")):
            fail(f"{include}/Python.h is missing: {sys.executable} has no development files. "
                 f"Debian: apt install python3-dev (python3.X-dev for another Debian Python)")

        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        build_dir = os.path.join(ROOT, BUILD_BASE, suffix.strip(".").replace(".so", "") or "py")
        configure = [cmake, "-S", ROOT, "-B", build_dir]
        if (not os.path.exists(os.path.join(build_dir, "CMakeCache.txt"))
                and "CMAKE_GENERATOR" not in os.environ and shutil.which("ninja")):
            configure += ["-G", "Ninja"]  # the generator of a configured folder stays as it is
        configure += [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_TESTING=OFF",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DSTRATA_PYTHON_REQUIRED=ON",
            "-DSTRATA_PYTHON_INSTALL_DIR=.",
            # pip shows a build's output only when it fails: a CUDA build that finds no nccl.h
            # (the CUDA toolkit's, or torch's nvidia-nccl wheel on this interpreter's sys.path)
            # fails, naming the wheel, instead of making a GPU wheel without the NCCL backend
            # unseen. Opting out: CMAKE_ARGS=-DSTRATA_WITH_NCCL=OFF (cmake/StrataNccl.cmake).
            "-DSTRATA_WITH_NCCL=ON",
            "-DSTRATA_NCCL_REQUIRED=ON",
        ]
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))  # last: they override
        targets = ["strata_python", "strata-info", "strata-run"]
        build = [cmake, "--build", build_dir, "--target", *targets]
        # Into setuptools' build folder (the wheel's contents), replacing an earlier build's.
        out = os.path.abspath(self.build_lib)
        shutil.rmtree(os.path.join(out, "strata"), ignore_errors=True)
        install = [cmake, "--install", build_dir, "--component", "python", "--prefix", out,
                   "--strip"]
        for step, command in (("configure", configure), ("build", build), ("install", install)):
            print("strata:", " ".join(shlex.quote(c) for c in command), flush=True)
            if subprocess.call(command) != 0:
                hint = (f" The reason is the CMake Error above (missing Debian packages: apt "
                        f"install {DEBIAN_PACKAGES}; NCCL's header: the wheel it names)"
                        if step == "configure" else "")
                fail(f"CMake's {step} step failed (build folder {build_dir}).{hint}")


os.makedirs(os.path.join(ROOT, BUILD_BASE), exist_ok=True)
setup(
    version=cmake_version(),
    # Nothing for setuptools to find or copy: CMake's install provides the whole package.
    packages=[],
    py_modules=[],
    ext_modules=[Extension("strata._strata", sources=[])],  # marks the wheel as binary
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
