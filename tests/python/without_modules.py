"""Runs a Python script as on a machine without some modules: each one named is unimportable
(`import torch` raises ImportError, as where torch is not installed).

    python3 tests/python/without_modules.py torch[,numpy,...] script.py [args...]

The script runs as __main__ with its own directory first on sys.path, as `python3 script.py`
would run it; its exit status is this command's. CTest runs the torch examples' usage errors
through it (examples/CMakeLists.txt): a usage error must not need torch.
"""

import os
import runpy
import sys


def main():
    if len(sys.argv) < 3:
        print("usage: without_modules.py MODULE[,MODULE...] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    for name in sys.argv[1].split(","):
        sys.modules[name] = None  # the import system's "not importable" marker
    script = sys.argv[2]
    sys.argv = sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
