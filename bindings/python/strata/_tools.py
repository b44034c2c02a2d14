"""The console entry points `strata-info` and `strata-run` of the pip-installed package: each
replaces this process with the binary the wheel carries in strata/bin/ (built by setup.py with
the module), passing the arguments and the environment through unchanged."""

import os
import sys

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def binary(name):
    """The path of the tool `name` for this package: strata/bin/<name> where pip installed it,
    <build>/tools/<name> where the package is a CMake build folder's (<build>/python/strata), or
    <prefix>/bin/<name> where `cmake --install` put it (<prefix>/lib/python3*/*-packages/strata).
    Only an ELF executable is taken: never a console-script wrapper, which would exec itself."""
    up = os.path.dirname
    candidates = [os.path.join(_PACKAGE, "bin", name),
                  os.path.join(up(up(_PACKAGE)), "tools", name),
                  os.path.join(up(up(up(up(_PACKAGE)))), "bin", name)]
    for path in candidates:
        if os.access(path, os.X_OK) and _is_elf(path):
            return path
    raise FileNotFoundError(
        f"strata: {name} is not where this package ({_PACKAGE}) carries it: "
        f"{candidates[0]} is missing. Reinstall strata with pip (pip install --no-build-isolation "
        f"<strata source>), or run {name} from a CMake build folder (<build>/tools/{name})")


def _is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _exec(name, args):
    try:
        path = binary(name)
    except FileNotFoundError as error:
        print(error, file=sys.stderr)
        sys.exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [name, *args])


def strata_info():
    """`strata-info [flags]`: the resolved configuration, the machine, the libraries found."""
    _exec("strata-info", sys.argv[1:])


def strata_run():
    """`strata-run -n N PROGRAM [ARGS]`: starts the local ranks of a job (docs/strata-run.md)."""
    _exec("strata-run", sys.argv[1:])
