"""Arrays in and out of the module (bindings/python/host_array.h): every array argument is read
through the buffer protocol or DLPack, never numpy's C API, so numpy arrays, memoryviews,
array.array and torch CPU tensors all work, and the values arrive as given. A wrong element type,
a strided layout or a wrong element count is an error naming the argument, never a silent
conversion (float16 and bfloat16 are widened to float32 exactly: the one documented conversion).
Results are numpy arrays that own their memory. Without numpy: arrays_without_numpy.py."""

import array

import numpy as np
import pytest
import torch

import strata
from conftest import solo_communicator

VALUES = [0.5, -1.25, 3.0, 2.0**-10, -7.5, 42.0]  # exact in float16 and bfloat16 too


def make_param(runtime, name, n=len(VALUES)):
    p = runtime.create(name, (n,), "float32", home="cpu")
    g = runtime.create(name + ".grad", (n,), "float32", home="cpu")
    return p, g


def float32_inputs():
    """The same six float32 values as every kind of host array the module takes."""
    values = np.array(VALUES, np.float32)
    return {
        "numpy": values.copy(),
        "numpy 2-D": values.reshape(2, 3).copy(),
        "array.array": array.array("f", VALUES),
        "memoryview": memoryview(array.array("f", VALUES)),
        "bytes as float32": memoryview(values.tobytes()).cast("f"),
        "torch": torch.tensor(VALUES),
        "torch requiring grad": torch.tensor(VALUES, requires_grad=True),
        "numpy float16 (widened)": values.astype(np.float16),
        "torch bfloat16 (widened)": torch.tensor(VALUES).to(torch.bfloat16),
        "torch float16 (widened)": torch.tensor(VALUES, dtype=torch.float16),
        # A contiguous slice at an offset (a view into a larger buffer).
        "numpy slice": np.concatenate([np.zeros(3, np.float32), values])[3:],
    }


@pytest.mark.parametrize("kind", list(float32_inputs()))
def test_initial_master_of_every_kind_arrives_as_given(runtime, kind):
    source = float32_inputs()[kind]
    p, g = make_param(runtime, "p")
    opt = strata.OffloadOptimizer(runtime)
    pid = opt.add_param("p", p, g, initial_master=source)
    master, exp_avg, _ = opt.read_state(pid)
    want = np.array(VALUES, np.float32)
    np.testing.assert_array_equal(master, want)  # not the first element repeated
    assert isinstance(master, np.ndarray) and master.dtype == np.float32
    assert master.flags.writeable and master.flags.c_contiguous
    np.testing.assert_array_equal(exp_avg, np.zeros(len(VALUES), np.float32))


def bad_inputs():
    """(what is passed, the error's text after "initial_master: got ")."""
    values = np.array(VALUES, np.float32)
    return [
        (values.astype(np.float64), r"a float64 numpy.ndarray of 6 elements; need float32 with 6 "
                                    r"elements \(the parameter's element count\): convert it with "
                                    r"\.astype\(numpy\.float32\)"),
        (values.astype(np.int32), r"an int32 numpy.ndarray of 6 elements; need float32"),
        (array.array("d", VALUES), r"a float64 array.array of 6 elements; need float32"),
        (torch.tensor(VALUES, dtype=torch.float64), r"a float64 torch.Tensor of 6 elements"),
        (torch.arange(6), r"an int64 torch.Tensor of 6 elements"),
        (values.astype(">f4"), r"a big-endian float32 numpy.ndarray"),
        (b"abcdef", r"a uint8 bytes of 6 elements; need float32"),
        (np.zeros(12, np.float32)[::2], r"a float32 numpy.ndarray of 6 elements whose elements are "
                                        r"not contiguous in memory \(a strided view\); need a "
                                        r"row-major \(C-contiguous\) array: pass "
                                        r"numpy.ascontiguousarray\(x\) or tensor.contiguous\(\)"),
        (torch.zeros(3, 2).t(), r"a float32 torch.Tensor of shape \(2, 3\) \(6 elements\) whose "
                                r"elements are not contiguous"),
        (values[:5], r"a float32 numpy.ndarray of 5 elements; need float32 with 6 elements"),
        (list(VALUES), r"a list; need an array in host memory that exports the buffer protocol "
                       r"or DLPack"),
    ]


@pytest.mark.parametrize("index", range(len(bad_inputs())))
def test_initial_master_refuses_what_it_would_misread(runtime, index):
    source, message = bad_inputs()[index]
    p, g = make_param(runtime, "p")
    opt = strata.OffloadOptimizer(runtime)
    with pytest.raises(strata.InvalidArgumentError,
                       match=r"^parameter 'p': initial_master: got " + message):
        opt.add_param("p", p, g, initial_master=source)
    # Nothing was registered: the same name is free.
    opt.add_param("p", p, g, initial_master=np.array(VALUES, np.float32))


def test_zero_engine_takes_and_gives_arrays_of_every_kind(runtime, comm):
    inputs = float32_inputs()
    kinds = ["array.array", "memoryview", "torch", "numpy 2-D", "torch bfloat16 (widened)"]
    params = [(f"p{i}", (2, 3), inputs[k]) for i, k in enumerate(kinds)]
    engine = strata.ZeroEngine(runtime, comm, params, stage=2, param_dtype="float32",
                               grad_dtype="float32", param_home="cpu", lr=0.5)
    for i, kind in enumerate(kinds):
        got = engine.read_param(f"p{i}")
        assert isinstance(got, np.ndarray) and got.shape == (2, 3) and got.dtype == np.float32
        want = np.array(VALUES, np.float32).reshape(2, 3)
        np.testing.assert_array_equal(got, want)
        master = engine.read_state(f"p{i}")[0]
        np.testing.assert_array_equal(master, want)
    # Gradients of every kind; the first Adam step moves each element by lr against its sign.
    grads = [(array.array("f", [1.0] * 6), 1), (memoryview(np.full(6, -1.0, np.float32)), -1),
             (torch.ones(2, 3), 1), (np.full((2, 3), -1.0, np.float16), -1),
             (torch.ones(6, dtype=torch.bfloat16), 1)]
    before = [engine.read_param(f"p{i}") for i in range(len(kinds))]
    for i, (gradient, _) in enumerate(grads):
        engine.add_grad(f"p{i}", gradient)
    engine.step()
    for i, (_, sign) in enumerate(grads):
        np.testing.assert_allclose(engine.read_param(f"p{i}"), before[i] - 0.5 * sign,
                                   rtol=1e-5, atol=1e-6)


def test_zero_engine_refuses_what_it_would_misread(runtime, comm):
    with pytest.raises(strata.InvalidArgumentError,
                       match=r"params\[0\] \('w'\) initial: got a float64 numpy.ndarray of 6 "
                             r"elements; need float32 with 6 elements \(the shape's element "
                             r"count\)"):
        strata.ZeroEngine(runtime, comm, [("w", 6, np.array(VALUES))])
    engine = strata.ZeroEngine(runtime, comm, [("w", (2, 3), None)], param_dtype="float32",
                               grad_dtype="float32", param_home="cpu")
    bad = [
        (np.ones(6), r"got a float64 numpy.ndarray of 6 elements; need float32"),
        (np.ones((3, 4), np.float32)[:, :2], r"got a float32 numpy.ndarray of shape \(3, 2\) "
                                             r"\(6 elements\) whose elements are not contiguous"),
        (torch.ones(6, dtype=torch.int32), r"got an int32 torch.Tensor"),
        (array.array("f", [1.0] * 5), r"got a float32 array.array of 5 elements; need float32 "
                                      r"with 6 elements \(the parameter's element count\)"),
    ]
    for gradient, message in bad:
        with pytest.raises(strata.InvalidArgumentError,
                           match=r"^add_grad: parameter 'w': gradient: " + message):
            engine.add_grad("w", gradient)
    # Nothing was added.
    engine.add_grad("w", np.zeros((2, 3), np.float32))
    assert not engine.step()["skipped"]
    np.testing.assert_array_equal(engine.read_param("w"), np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("make", [
    lambda: np.arange(6, dtype=np.float32).reshape(2, 3),
    lambda: np.arange(6, dtype=np.float64),
    lambda: np.arange(6, dtype=np.float16).reshape(3, 2),
    lambda: np.arange(6, dtype=np.int32),
    lambda: np.arange(6, dtype=np.int64).reshape(1, 6),
    lambda: np.arange(6, dtype=np.uint8),
    lambda: array.array("d", range(6)),
    lambda: memoryview(array.array("i", range(6))).cast("B").cast("i", (2, 3)),
    lambda: torch.arange(6, dtype=torch.float32).reshape(3, 2),
    lambda: torch.arange(6, dtype=torch.int64),
    lambda: np.zeros((0, 4), np.float32),
], ids=["f32-2d", "f64", "f16", "i32", "i64", "u8", "array.array", "memoryview", "torch-f32",
        "torch-i64", "empty"])
def test_communicator_keeps_dtype_shape_and_values(runtime, make):
    comm = solo_communicator(runtime)
    source = make()
    want = np.asarray(source.numpy() if isinstance(source, torch.Tensor) else source)
    for got in (comm.all_reduce(source, op="sum"), comm.broadcast(source)):
        assert isinstance(got, np.ndarray) and got.flags.writeable
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        got.reshape(-1)[:1] = 1  # the result is its own copy
    np.testing.assert_array_equal(np.asarray(make()), want)


def test_communicator_refuses_what_it_would_misread(runtime):
    comm = solo_communicator(runtime)
    cases = [
        (np.arange(12, dtype=np.float32)[::2],
         r"all_reduce: array: got a float32 numpy.ndarray of 6 elements whose elements are not "
         r"contiguous"),
        (np.zeros(2, np.complex64), r"all_reduce: array: got a complex64 numpy.ndarray of 2 "
                                    r"elements; complex64 is not one the communicator reduces"),
        (np.zeros(2, np.uint16), r"uint16 is not one the communicator reduces"),
        (torch.zeros(2, dtype=torch.bfloat16), r"bfloat16 is not one the communicator reduces"),
        ([1.0, 2.0], r"all_reduce: array: got a list; need an array in host memory"),
    ]
    for source, message in cases:
        with pytest.raises(strata.InvalidArgumentError, match=message):
            comm.all_reduce(source)
    with pytest.raises(strata.InvalidArgumentError,
                       match=r"broadcast: array: got a float32 torch.Tensor of shape \(3, 2\) "
                             r"\(6 elements\) whose elements are not contiguous"):
        comm.broadcast(torch.zeros(2, 3).t())


def test_results_are_numpy_arrays_over_strata_memory(runtime):
    comm = solo_communicator(runtime)
    got = comm.all_reduce(np.ones(4, np.float32))
    # numpy.asarray over the module's HostBuffer (the buffer protocol), no copy and no numpy C API.
    assert isinstance(got.base, memoryview) and isinstance(got.base.obj, strata._strata.HostBuffer)
    assert torch.from_numpy(got).tolist() == [1.0] * 4


def test_the_module_does_not_use_numpys_c_api():
    """pybind11/numpy.h imports numpy.core.multiarray._ARRAY_API at its first use; the module
    never names it (checked in the binary by CTest python.no_numpy_api too)."""
    path = strata._strata.__file__
    with open(path, "rb") as f:
        data = f.read()
    assert b"_ARRAY_API" not in data
