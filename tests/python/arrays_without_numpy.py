"""strata's array arguments and results with no numpy at all (CTest python.arrays_without_numpy).

numpy is made unimportable before strata is imported (sys.modules["numpy"] = None), so a module
that used numpy's C API (pybind11/numpy.h imports numpy.core.multiarray at its first array)
fails here. Every array path is exercised with memoryview and array.array instead: the
optimizer's initial_master and read_state, the ZeroEngine's initial values, add_grad, read_param
and read_state, the Communicator's all_reduce and broadcast; results are memoryviews of the
right format and shape, and wrong inputs are errors that name the argument.

A plain script (no pytest, no torch): it also runs under an interpreter that has none of them,
with a module built for it (docs/python.md, "Arrays").

    PYTHONPATH=<build>/python STRATA_BACKEND=host python3 tests/python/arrays_without_numpy.py
"""

import sys

sys.modules["numpy"] = None  # `import numpy` raises ImportError from here on

import array  # noqa: E402
import socket  # noqa: E402

import strata  # noqa: E402

VALUES = [0.5, -1.25, 3.0, 2.0**-10, -7.5, 42.0]
failures = []


def check(condition, what):
    print(("ok: " if condition else "FAILED: ") + what)
    if not condition:
        failures.append(what)


def raises(call, text, what):
    try:
        call()
    except strata.InvalidArgumentError as error:
        check(text in str(error), f"{what}: {error}")
        return
    check(False, f"{what}: no error")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    try:
        import numpy  # noqa: F401
        check(False, "numpy is blocked")
    except ImportError:
        check(True, "numpy is blocked")

    rt = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB", nvme_paths=None)

    # The offload optimizer: initial_master from array.array, read back as memoryviews.
    p = rt.create("p", (6,), "float32", home="cpu")
    g = rt.create("p.grad", (6,), "float32", home="cpu")
    opt = strata.OffloadOptimizer(rt)
    raises(lambda: opt.add_param("p", p, g, initial_master=array.array("d", VALUES)),
           "initial_master: got a float64 array.array of 6 elements; need float32",
           "add_param refuses float64")
    pid = opt.add_param("p", p, g, initial_master=array.array("f", VALUES))
    master, exp_avg, _ = opt.read_state(pid)
    check(isinstance(master, memoryview) and master.format == "f" and master.shape == (6,),
          f"read_state gives a float32 memoryview ({type(master).__name__}, {master.format!r})")
    check(master.tolist() == VALUES, f"the master holds the values given: {master.tolist()}")
    check(exp_avg.tolist() == [0.0] * 6, "exp_avg starts at zero")

    # The ZeRO engine: initial values, gradients and results without numpy.
    comm = strata.Communicator.from_environment(
        rt, rank=None, world_size=None, local_rank=None, master_addr="127.0.0.1",
        master_port=free_port(), comm_backend="gloo", comm_timeout="60s")
    initial = memoryview(array.array("f", VALUES)).cast("B").cast("f", (2, 3))
    engine = strata.ZeroEngine(rt, comm, [("w", (2, 3), initial)], stage=2,
                               param_dtype="float32", grad_dtype="float32", param_home="cpu",
                               lr=0.5)
    w = engine.read_param("w")
    check(isinstance(w, memoryview) and w.shape == (2, 3) and w.format == "f",
          f"read_param gives a (2, 3) float32 memoryview: {w.shape}")
    check(w.tolist() == [VALUES[:3], VALUES[3:]], f"the parameter holds its values: {w.tolist()}")
    raises(lambda: engine.add_grad("w", array.array("d", [1.0] * 6)),
           "add_grad: parameter 'w': gradient: got a float64 array.array of 6 elements",
           "add_grad refuses float64")
    raises(lambda: engine.add_grad("w", memoryview(array.array("f", [1.0] * 12))[::2]),
           "whose elements are not contiguous", "add_grad refuses a strided view")
    engine.add_grad("w", array.array("f", [1.0, -1.0, 1.0, -1.0, 1.0, -1.0]))
    engine.step()
    after = [x for row in engine.read_param("w").tolist() for x in row]
    want = [v - 0.5 * s for v, s in zip(VALUES, [1, -1, 1, -1, 1, -1])]
    check(all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(after, want)),
          f"one Adam step moved each element by lr against its gradient's sign: {after}")
    m, _, _ = engine.read_state("w")
    check(isinstance(m, memoryview) and m.shape == (2, 3), "ZeroEngine.read_state: memoryviews")

    # The communicator: dtype and shape kept, the input untouched.
    source = array.array("d", VALUES)
    got = comm.all_reduce(source, op="sum")
    check(isinstance(got, memoryview) and got.format == "d" and got.tolist() == VALUES,
          f"all_reduce of an array.array('d'): {got.format!r} {got.tolist()}")
    ints = memoryview(array.array("i", range(6))).cast("B").cast("i", (2, 3))
    got = comm.broadcast(ints)
    check(got.format == "i" and got.shape == (2, 3) and got.tolist() == ints.tolist(),
          f"broadcast of a (2, 3) int32 memoryview: {got.shape} {got.tolist()}")
    raises(lambda: comm.all_reduce([1.0, 2.0]), "all_reduce: array: got a list",
           "all_reduce refuses a list")
    raises(lambda: comm.all_reduce(array.array("H", [1, 2])),
           "uint16 is not one the communicator reduces", "all_reduce refuses uint16")

    print("PASS" if not failures else f"FAIL: {len(failures)} check(s) failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
