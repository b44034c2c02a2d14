"""python.pip_install: strata installed the way a PyTorch user installs it, and tested there.

    pip_install.py SOURCE_DIR WORK_DIR [--cmake-args ARGS] [--other-python PATH|auto]

1. A clean copy of SOURCE_DIR (its git files, committed or not, or the tree less build folders).
2. venv A (--system-site-packages from this interpreter: Debian's torch, numpy, pytest, setuptools
   and wheel come through): `pip install --no-build-isolation --no-deps --no-index COPY`. Then,
   with PYTHONPATH unset and the working directory outside the copy: strata is imported from the
   venv, every module of the package imports from there, the installed strata-info and
   `python -m strata` print the same, tests/python's core, torch and tools files pass and
   examples/torch_trainer trains to PASS.
3. `pip wheel` of the same copy reuses its CMake build (the module and tools are not relinked),
   and the wheel installed into venv B imports every module, passes tests/python/test_core.py
   and runs strata-info.
4. Another interpreter (pyenv's, or any python3.X with headers that is not this one's version):
   the same CMake build makes the module for it too (STRATA_EXTRA_PYTHONS) and
   tests/python/arrays_without_numpy.py passes under it. Skipped with a reason when there is none.

Exit 0 on success, 77 (skipped) when python3-venv, pip, setuptools or wheel is missing, 1 on a
failure. WORK_DIR is removed at the end, also on failure.
"""

import argparse
import difflib
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time

SKIP = 77
TORCH_TRAINER_STEPS = "8"
PYTEST_IN_VENV = ("test_core.py", "test_torch.py", "test_tools.py")


class Failure(Exception):
    pass


def log(message):
    print(f"pip_install: {message}", flush=True)


def run(command, env, cwd, expect=0):
    """Runs command, echoing it; returns its stdout (stderr passes through). Raises Failure."""
    log("$ " + " ".join(shlex.quote(str(c)) for c in command))
    start = time.monotonic()
    result = subprocess.run([str(c) for c in command], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            text=True)
    log(f"  ({time.monotonic() - start:.1f} s, exit {result.returncode})")
    if expect is not None and result.returncode != expect:
        print(result.stdout, flush=True)
        raise Failure(f"exit {result.returncode} (expected {expect}): {command[0]} ...")
    return result.stdout


def prerequisites():
    """None when a venv with pip, setuptools and wheel can be made here; else why not."""
    for module, package in (("ensurepip", "python3-venv"), ("venv", "python3-venv"),
                            ("pip", "python3-pip"), ("setuptools", "python3-setuptools"),
                            ("wheel", "python3-wheel")):
        # Found, not imported: setuptools refuses to load after venv has imported distutils.
        if importlib.util.find_spec(module) is None:
            return f"{sys.executable} has no module {module} (Debian: apt install {package})"
    return None


def copy_source(source, dest):
    """The files of the source tree a user would have: git's files (tracked, and untracked ones
    not ignored) when it is a git work tree, else everything but build folders and .git."""
    try:
        listed = subprocess.run(["git", "-C", source, "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], check=True, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = None
    if listed is None:
        shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(
            "build*", ".git", "__pycache__", "*.egg-info", "dist"))
        return
    for name in filter(None, listed):
        path = os.path.join(source, name)
        if not os.path.lexists(path):
            continue  # deleted in the work tree, not yet in git
        os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
        shutil.copy2(path, os.path.join(dest, name), follow_symlinks=False)


def clean_env(venv=None, **extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
           and not k.startswith("STRATA_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["STRATA_BACKEND"] = "host"
    if venv:
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def check_installed(venv, work, copy):
    """strata imports from the venv (not the copy, not a build folder); strata-info and
    `python -m strata` print the same thing."""
    python = os.path.join(venv, "bin", "python")
    env = clean_env(venv)
    where = run([python, "-c", "import strata, strata._strata as m; print(strata.__file__); "
                 "print(m.__file__)"], env, work).split()
    real_venv = os.path.realpath(venv)
    for path in where:
        if not os.path.realpath(path).startswith(real_venv + os.sep):
            raise Failure(f"strata was imported from {path}, not from the venv {venv}")
    log(f"strata imported from {where[0]}")
    # Every pure-Python module of the source tree is installed and imports from the venv.
    modules = sorted(os.path.splitext(os.path.basename(f))[0]
                     for f in glob.glob(os.path.join(copy, "bindings", "python", "strata", "*.py")))
    modules = [f"strata.{m}" for m in modules if m not in ("__init__", "__main__")]
    code = ("import importlib, os, sys\n"
            "for name in sys.argv[1:]:\n"
            "    m = importlib.import_module(name)\n"
            "    assert os.path.realpath(m.__file__).startswith(os.path.realpath(sys.prefix)), "
            "m.__file__\n")
    run([python, "-c", code, *modules], env, work)
    log(f"{len(modules)} modules import from the venv: {', '.join(modules)}")
    # No RPATH/RUNPATH into a build folder (CMake's install drops the build tree's).
    package = os.path.dirname(where[0])
    if shutil.which("readelf"):
        for binary in [where[1], *glob.glob(os.path.join(package, "bin", "*"))]:
            dynamic = run(["readelf", "-d", binary], env, work)
            for line in dynamic.splitlines():
                if ("RPATH" in line or "RUNPATH" in line) and (work in line or "build" in line):
                    raise Failure(f"{binary} keeps a build folder's run path: {line.strip()}")
    info = run([os.path.join(venv, "bin", "strata-info")], env, work)
    via_python = run([python, "-m", "strata"], env, work)
    # The figures that move between two runs (free memory, free space) are left out.
    def stable(text):
        return re.sub(r"[0-9][0-9.,]*\s*(B|KiB|MiB|GiB|TiB|kB|MB|GB|TB|%)\b", "N", text)
    if stable(info) != stable(via_python) or "Configuration" not in info:
        diff = "\n".join(difflib.unified_diff(info.splitlines(), via_python.splitlines(),
                                              "strata-info", "python -m strata", lineterm=""))
        raise Failure(f"strata-info and python -m strata differ:\n{diff or info}")
    # Flags reach strata-info: its usage error (exit 2, naming the flag).
    status = subprocess.run([python, "-m", "strata", "--no-such-flag"], env=env, cwd=work,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if status.returncode != 2 or "--no-such-flag" not in status.stderr:
        raise Failure(f"python -m strata --no-such-flag: exit {status.returncode}, "
                      f"{status.stderr!r} (expected strata-info's usage error, exit 2)")
    help_text = run([os.path.join(venv, "bin", "strata-run"), "--help"], env, work, expect=None)
    if "strata-run" not in help_text:
        raise Failure(f"strata-run --help printed {help_text!r}")


def run_pytest(venv, work, copy, files):
    """tests/python (or some of its files) against the installed package; strata is imported
    first and checked to come from the venv, so the tests cannot pick up another copy."""
    python = os.path.join(venv, "bin", "python")
    code = ("import os, sys, strata, pytest\n"
            "assert os.path.realpath(strata.__file__).startswith(os.path.realpath(sys.prefix)), "
            "strata.__file__\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *sys.argv[1:]]))\n")
    out = run([python, "-c", code, *files], clean_env(venv), work)
    print(out.rstrip().splitlines()[-1] if out.strip() else "", flush=True)


def run_torch_trainer(venv, work, copy):
    python = os.path.join(venv, "bin", "python")
    env = clean_env(venv, STRATA_GPU_BYTES="640KiB", STRATA_CPU_BYTES="64MiB",
                    STRATA_NVME_PATHS="", STRATA_STAGING_BYTES="8MiB")
    result = subprocess.run([python, os.path.join(copy, "examples", "torch_trainer", "train.py"),
                             f"--steps={TORCH_TRAINER_STEPS}", "--device=cpu"], env=env, cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode == SKIP:
        log("examples/torch_trainer skipped: torch is not importable in the venv")
        return
    if result.returncode != 0 or "\nPASS\n" not in result.stdout:
        print(result.stdout, flush=True)
        raise Failure(f"examples/torch_trainer/train.py: exit {result.returncode}, no PASS")
    log(f"examples/torch_trainer: PASS ({TORCH_TRAINER_STEPS} steps)")


def make_venv(python, path, work):
    run([python, "-m", "venv", "--system-site-packages", path], clean_env(), work)
    return path


def other_python(choice):
    """An interpreter of another version than this one's, with headers, or (None, why not)."""
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    if choice and choice != "auto":
        candidates = [choice]
    else:
        root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
        # The newest first (the GPU machine's venv was 3.12; users move to new Pythons first).
        candidates = sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python3")),
                            key=lambda p: [int(x) for x in re.findall(
                                r"[0-9]+", os.path.basename(os.path.dirname(os.path.dirname(p))))],
                            reverse=True)
        candidates += [p for p in (shutil.which(f"python3.{m}") for m in range(13, 8, -1)) if p]
    for python in candidates:
        try:
            out = subprocess.run([python, "-c", "import sys, sysconfig; "
                                  "print('%d.%d' % sys.version_info[:2]); "
                                  "print(sysconfig.get_paths()['include'])"], check=True,
                                 stdout=subprocess.PIPE, text=True, timeout=30).stdout.split("\n")
        except (OSError, subprocess.SubprocessError):
            continue
        version, include = out[0], out[1]
        if version == mine or tuple(map(int, version.split("."))) < (3, 9):
            continue
        if os.path.exists(os.path.join(include, "Python.h")):
            return python, None
    return None, (f"no Python 3.9+ other than {mine} with its headers (looked at pyenv's "
                  f"versions and python3.X on PATH; --other-python names one)")


def check_other_python(python, copy, work, cmake_args):
    """The pip build's CMake folder makes the module for `python` too; it imports and passes
    arrays_without_numpy.py (no numpy or torch needed) under that interpreter."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    build = os.path.join(copy, "build-pip", suffix.strip(".").replace(".so", ""))
    env = clean_env()
    run(["cmake", "-S", copy, "-B", build, f"-DSTRATA_EXTRA_PYTHONS={python}", *cmake_args],
        env, work)
    with open(os.path.join(build, "CMakeCache.txt"), encoding="utf-8") as f:
        targets = re.search(r"^STRATA_EXTRA_PYTHON_TARGETS:INTERNAL=(.*)$", f.read(),
                            re.M).group(1).split(";")
    run(["cmake", "--build", build, "--target", *targets], env, work)
    env = clean_env(PYTHONPATH=os.path.join(build, "python"))
    out = run([python, os.path.join(copy, "tests", "python", "arrays_without_numpy.py")], env,
              work)
    if "PASS" not in out:
        raise Failure(f"arrays_without_numpy.py under {python} did not PASS")
    log(f"{python}: the module builds, imports and passes arrays_without_numpy.py")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("work")
    parser.add_argument("--cmake-args", default="",
                        help="CMAKE_ARGS for the pip build (e.g. the build's compiler launcher)")
    parser.add_argument("--other-python", default="auto")
    args = parser.parse_args()

    why_not = prerequisites()
    if why_not:
        print(f"SKIPPED: {why_not}")
        return SKIP
    start = time.monotonic()
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        copy = os.path.join(work, "source")
        copy_source(os.path.abspath(args.source), copy)
        pip_env = lambda venv: clean_env(venv, CMAKE_ARGS=args.cmake_args)  # noqa: E731

        log("A: pip install into a venv")
        venv_a = make_venv(sys.executable, os.path.join(work, "venv-a"), work)
        pip_a = os.path.join(venv_a, "bin", "pip")
        run([pip_a, "install", "--no-build-isolation", "--no-deps", "--no-index", copy],
            pip_env(venv_a), work)
        check_installed(venv_a, work, copy)
        # Against the installed package: the core API, torch's tensors through it, and the tools
        # as the venv runs them (strata/bin/). The whole of tests/python (python.pytest runs it
        # against the build tree's same module) cost 27 of this test's 270 s on CI's two cores,
        # and check_installed has imported every module from the venv.
        run_pytest(venv_a, work, copy, [os.path.join(copy, "tests", "python", name)
                                        for name in PYTEST_IN_VENV])
        run_torch_trainer(venv_a, work, copy)

        log("B: pip wheel of the same copy, installed into a second venv")
        built = glob.glob(os.path.join(copy, "build-pip", "*", "python", "strata", "_strata*.so"))
        built += glob.glob(os.path.join(copy, "build-pip", "*", "tools", "strata-*"))
        stamps = {path: os.stat(path).st_mtime_ns for path in built}
        if len(stamps) < 3:
            raise Failure(f"the pip build left no module and tools under build-pip/: {built}")
        dist = os.path.join(work, "dist")
        run([pip_a, "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", dist, copy],
            pip_env(venv_a), work)
        rebuilt = [p for p, t in stamps.items() if os.stat(p).st_mtime_ns != t]
        if rebuilt:
            raise Failure(f"pip wheel rebuilt what pip install had built: {rebuilt}")
        wheels = glob.glob(os.path.join(dist, "strata-*.whl"))
        if len(wheels) != 1:
            raise Failure(f"pip wheel made {wheels} in {dist}, expected one strata wheel")
        log(f"wheel: {os.path.basename(wheels[0])}, {os.path.getsize(wheels[0]) >> 10} KiB")
        venv_b = make_venv(sys.executable, os.path.join(work, "venv-b"), work)
        run([os.path.join(venv_b, "bin", "pip"), "install", "--no-deps", "--no-index", wheels[0]],
            clean_env(venv_b), work)
        check_installed(venv_b, work, copy)
        # The wheel holds venv A's build (checked above: nothing rebuilt) and check_installed
        # imported every module from it: the core tests suffice here (the whole of tests/python
        # again cost CI 28 s).
        run_pytest(venv_b, work, copy, [os.path.join(copy, "tests", "python", "test_core.py")])

        log("C: another interpreter")
        python, why_not = other_python(args.other_python)
        if python is None:
            log(f"C skipped: {why_not}")
        else:
            check_other_python(python, copy, work, shlex.split(args.cmake_args))
        log(f"all checks passed in {time.monotonic() - start:.0f} s")
        return 0
    except Failure as failure:
        print(f"pip_install: FAILED: {failure}", flush=True)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
