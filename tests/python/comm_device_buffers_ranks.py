"""Every rank of a strata-run job (CTest python.comm_device_buffers_2:
`strata-run -n 2 python3 -m pytest tests/python/comm_device_buffers_ranks.py`) calls
Communicator.all_reduce and broadcast with host arrays on a communicator that takes device
memory only, as NCCL does: strata._strata.testing.device_buffers_only makes the job's Gloo
communicator on the host backend refuse every host buffer. The arrays must still reduce and
broadcast, through the runtime's device memory (comm.cc's bounce), with the results the host
path gives; without the bounce every call here fails with the refusal. Not collected by the
one-process run (the name is not test_*.py)."""

import os

import numpy as np
import pytest

import strata
from strata._strata import testing

pytestmark = pytest.mark.skipif("WORLD_SIZE" not in os.environ,
                                reason="run under strata-run -n 2 (CTest python.comm_device_buffers_2)")

PIECE = 16 << 20  # comm.cc's kBouncePieceBytes: a larger array goes through in pieces


@pytest.fixture(scope="module")
def comm():
    rt = strata.Runtime(backend="host", gpu_bytes="16MiB", cpu_bytes="16MiB", nvme_paths=None)
    c = strata.Communicator.from_environment(rt, comm_backend="gloo")
    assert c.size == 2
    testing.device_buffers_only(c)
    assert "device buffers only: testing" in repr(c)  # the refusal is in place
    return c


def calls(comm, kind):
    return comm.stats()[kind]["calls"]


def test_all_reduce_of_host_arrays(comm):
    rank = comm.rank
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * rank
    before = x.copy()
    ones = np.ones((3, 4), np.float32)
    got = comm.all_reduce(x)
    assert got.shape == (3, 4) and got.dtype == np.float32
    assert np.array_equal(got, 2 * np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * ones)
    assert np.array_equal(x, before)  # the input stays as it was
    assert np.array_equal(comm.all_reduce(x, "average"), got / 2)
    assert np.array_equal(comm.all_reduce(x, "max"), before - 100 * rank + 100)
    assert np.array_equal(comm.all_reduce(x, "min"), before - 100 * rank)
    # zero_train.py's loss and check reductions: a float64 scalar, an int32 flag.
    assert comm.all_reduce(np.array([0.25 + rank], np.float64))[0] == 1.5
    assert comm.all_reduce(np.array([rank], np.int32), "max")[0] == 1
    empty = comm.all_reduce(np.zeros(0, np.float32))
    assert empty.shape == (0,)


def test_broadcast_of_host_arrays(comm):
    rank = comm.rank
    for root in (0, 1):
        x = np.full(5, 10.0 * (rank + 1), np.float64)
        got = comm.broadcast(x, root)
        assert np.array_equal(got, np.full(5, 10.0 * (root + 1)))
        assert np.array_equal(x, np.full(5, 10.0 * (rank + 1)))


def test_an_array_larger_than_a_piece_goes_through_in_pieces(comm):
    # zero_shard's start-up broadcast holds the whole model: it must not need device memory of
    # that size, so it goes in pieces of at most PIECE bytes, one collective each on every rank.
    n = PIECE // 4 + 1000  # float32: two pieces, the second small
    values = np.arange(n, dtype=np.float32) % 1024
    before = calls(comm, "broadcast")
    got = comm.broadcast(values + comm.rank, 0)
    assert calls(comm, "broadcast") - before == 2
    assert np.array_equal(got, values)
    before = calls(comm, "all_reduce")
    got = comm.all_reduce(values + comm.rank)
    assert calls(comm, "all_reduce") - before == 2
    assert np.array_equal(got, 2 * values + 1)
