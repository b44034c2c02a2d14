"""The DLPack stream protocol on the host backend, shown with stream gates instead of timing.

A gate (strata._strata.testing.hold) holds device work issued while it is closed. Each test
closes one, makes the call, checks that the call returned and that the work it ordered has not
run, opens the gate and checks that the bytes arrived in order."""

import ctypes

import numpy as np
import pytest
import torch

import strata
from strata._strata import testing

N = 4096


@pytest.fixture
def rt():
    return strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB")


def write_home(tensor, values):
    with tensor.acquire("cpu", "w") as view:
        torch.from_dlpack(view).copy_(torch.from_numpy(values))  # numpy's views are read-only


def read_home(tensor):
    with tensor.acquire("cpu", "r") as view:
        return np.from_dlpack(view).copy()


def test_acquire_and_dlpack_return_while_the_copy_is_held(rt):
    t = rt.create("x", (N,), "uint8", home="cpu")
    pattern = (np.arange(N) % 251).astype(np.uint8)
    write_home(t, pattern)
    consumer = rt.create_stream()
    out = np.zeros(N, np.uint8)
    with testing.hold(rt, exempt=[consumer]) as gate:
        # The host-to-device copy is issued on the store's stream and held there.
        a = t.acquire("gpu", "r")  # returns: it does not wait for the copy
        gate.wait_until_held(1)
        capsule = a.__dlpack__(stream=consumer.handle)  # returns: the consumer waits instead
        assert capsule is not None
        testing.copy_async(consumer, out.ctypes.data, a.address, N, "d2h")
        assert gate.held >= 1
        assert not out.any()  # the consumer's read waits for strata's copy
    consumer.synchronize()
    np.testing.assert_array_equal(out, pattern)
    a.release(stream=consumer)


def test_release_orders_strata_after_the_consumers_work(rt):
    t = rt.create("y", (N,), "uint8", home="cpu")
    old = np.full(N, 7, np.uint8)
    new = (np.arange(N) % 13).astype(np.uint8)
    write_home(t, old)
    writer = rt.create_stream()
    reader = rt.create_stream()
    out = np.zeros(N, np.uint8)

    a = t.acquire("gpu", "w")
    a.__dlpack__(stream=writer)  # the writer's stream waits until the memory is ready
    with testing.hold_stream(writer) as gate:
        testing.copy_async(writer, a.address, new.ctypes.data, N, "h2d")  # held
        a.release(stream=writer)  # returns: strata records the end of the write on `writer`
        gate.wait_until_held(1)
        # The next use of the memory waits for the writer's (held) work, not the host.
        b = t.acquire("gpu", "r")
        b.__dlpack__(stream=reader)
        testing.copy_async(reader, out.ctypes.data, b.address, N, "d2h")
        assert not out.any()
    reader.synchronize()
    np.testing.assert_array_equal(out, new)
    b.release(stream=reader)
    rt.flush()
    np.testing.assert_array_equal(read_home(t), new)


def test_release_without_a_stream_uses_the_streams_seen_at_dlpack(rt):
    t = rt.create("z", (N,), "uint8", home="cpu")
    new = (np.arange(N) % 17).astype(np.uint8)
    write_home(t, np.full(N, 5, np.uint8))
    writer = rt.create_stream()
    reader = rt.create_stream()
    out = np.zeros(N, np.uint8)
    with t.acquire("gpu", "w") as a:
        a.__dlpack__(stream=writer.handle)
        gate = testing.hold_stream(writer)
        testing.copy_async(writer, a.address, new.ctypes.data, N, "h2d")
        gate.wait_until_held(1)
    # __exit__ released after the writer's work without waiting for it.
    with t.acquire("gpu", "r") as b:
        b.__dlpack__(stream=reader)
        testing.copy_async(reader, out.ctypes.data, b.address, N, "d2h")
        assert not out.any()
        gate.open()
        reader.synchronize()
    np.testing.assert_array_equal(out, new)


def test_host_consumer_waits_at_dlpack_and_minus_one_does_not_wait(rt):
    t = rt.create("w", (N,), "uint8", home="cpu")
    pattern = (np.arange(N) % 7).astype(np.uint8)
    write_home(t, pattern)
    gate = testing.hold(rt)
    a = t.acquire("gpu", "r")
    gate.wait_until_held(1)
    a.__dlpack__(stream=-1)  # no ordering asked: returns with the copy held
    assert gate.held >= 1
    gate.open()
    np.testing.assert_array_equal(np.from_dlpack(a), pattern)  # stream=None: the host waited
    a.release()

    b = t.acquire("gpu", "r")
    b.synchronize()  # for code that reads `address` directly
    raw = (ctypes.c_uint8 * N).from_address(b.address)
    np.testing.assert_array_equal(np.frombuffer(raw, np.uint8), pattern)
    b.release()


def test_stream_arguments_are_checked(rt):
    t = rt.create("v", (16,), "uint8", home="cpu")
    other = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB")
    with t.acquire("gpu", "r") as a:
        with pytest.raises(strata.InvalidArgumentError, match="no live stream"):
            a.__dlpack__(stream=123456)
        with pytest.raises(strata.InvalidArgumentError, match="another strata.Runtime"):
            a.__dlpack__(stream=other.create_stream())
        with pytest.raises(strata.InvalidArgumentError, match="stream must be"):
            a.__dlpack__(stream="s")
        with pytest.raises(strata.InvalidArgumentError, match="-2"):
            a.release(stream=-2)
        assert not a.released
    s = rt.create_stream()
    assert s.handle > 2 and int(s) == s.handle
    assert rt.create_stream().handle != s.handle


def test_gates_are_a_host_backend_hook(rt):
    s = rt.create_stream()
    with testing.hold_stream(s) as gate:
        assert not gate.is_open
    assert gate.is_open
    with pytest.raises(strata.InvalidArgumentError, match="another Runtime"):
        testing.hold(strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB"),
                     exempt=[s])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA torch and a GPU")
def test_torch_side_stream_on_cuda():
    # Never run here (torch 1.13 CPU, no GPU): tools/gpu-check.sh runs it on a GPU machine.
    rt = strata.Runtime(backend="cuda", gpu_bytes="64MiB", cpu_bytes="64MiB")
    t = rt.create("c", (1 << 20,), "float32", home="cpu")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = t.acquire("gpu", "w")
        view = torch.from_dlpack(a)  # passes side.cuda_stream: side waits for the memory
        view.fill_(3.0)
        del view
        a.release(stream=side)  # strata's next use waits for fill_ on `side`
    with t.acquire("cpu", "r") as b:
        assert torch.from_dlpack(b).eq(3.0).all()
