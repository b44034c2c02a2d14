"""Every rank of a strata-run job (CTest python.zero_ranks_2:
`strata-run -n 2 python3 -m pytest tests/python/zero_ranks.py`) trains a linear regression with
strata.ZeroEngine at stages 1 and 2, each rank on its half of the batch, and checks its losses
and parameters against a one-rank run in the same process (a job of its own) fed the ranks'
averaged gradient: bitwise, so every rank agrees with the others too (also checked through the
communicator). Not collected by the one-process run (the name is not test_*.py)."""

import os
import shutil
import tempfile

import numpy as np
import pytest

import strata
from conftest import solo_communicator

pytestmark = pytest.mark.skipif("WORLD_SIZE" not in os.environ,
                                reason="run under strata-run -n 2 (CTest python.zero_ranks_2)")

BATCH, FEATURES, OUTPUTS, STEPS = 16, 6, 3, 10


def small_runtime():
    return strata.Runtime(backend="host", gpu_bytes="16MiB", cpu_bytes="16MiB",
                          nvme_paths=None)


@pytest.fixture(scope="module")
def job():
    """The job's communicator (one for the whole run: one rendezvous per job at a time)."""
    rt = small_runtime()
    return strata.Communicator.from_environment(rt)


@pytest.fixture(scope="module")
def solo():
    return solo_communicator(small_runtime())


def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    y = rng.standard_normal((BATCH, OUTPUTS)).astype(np.float32)
    w0 = (0.1 * rng.standard_normal((FEATURES, OUTPUTS))).astype(np.float32)
    return x, y, w0


def gradients(w, b, x, y):
    """Mean-squared-error gradients of (w, b) on the rows (x, y), in float32."""
    residual = x @ w + b - y
    n = np.float32(len(x))
    return (x.T @ residual) / n, residual.sum(axis=0) / n


def loss(w, b, x, y):
    residual = (x.astype(np.float64) @ w + b - y)
    return float(0.5 * np.mean(np.sum(residual * residual, axis=1)))


def engine_for(comm, stage, w0):
    return strata.ZeroEngine(comm.runtime, comm,
                             [("w", (FEATURES, OUTPUTS), w0), ("b", (OUTPUTS,), None)],
                             stage=stage, param_dtype="float32", grad_dtype="float32",
                             bucket_bytes=64, alignment=4, param_home="cpu", lr=0.05,
                             betas=(0.9, 0.99), weight_decay=0.01)


@pytest.mark.parametrize("stage", [1, 2])
def test_ranks_match_one_rank(job, solo, stage):
    rank, ranks = job.rank, job.size
    assert ranks == int(os.environ["WORLD_SIZE"]) == 2
    x, y, w0 = data()
    half = BATCH // ranks
    shards = [(x[r * half:(r + 1) * half], y[r * half:(r + 1) * half]) for r in range(ranks)]
    engine = engine_for(job, stage, w0)
    reference = engine_for(solo, stage, w0)
    losses, reference_losses = [], []
    for step in range(STEPS):
        w, b = engine.read_param("w"), engine.read_param("b")
        rw, rb = reference.read_param("w"), reference.read_param("b")
        losses.append(loss(w, b, x, y))
        reference_losses.append(loss(rw, rb, x, y))
        gw, gb = gradients(w, b, *shards[rank])
        engine.add_grad("w", gw)
        engine.add_grad("b", gb)
        # What the job's reduction averages, in the same float32 arithmetic (two ranks: the
        # sum is the same in either order, the halving exact).
        rgs = [gradients(rw, rb, *shard) for shard in shards]
        reference.add_grad("w", (rgs[0][0] + rgs[1][0]) * np.float32(0.5))
        reference.add_grad("b", (rgs[0][1] + rgs[1][1]) * np.float32(0.5))
        got, want = engine.step(), reference.step()
        assert got["step"] == want["step"] == step + 1
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
    assert losses == reference_losses, "the losses differ from the one-rank run"
    assert losses[-1] < losses[0]
    for name in ("w", "b"):
        mine = engine.read_param(name)
        np.testing.assert_array_equal(mine, reference.read_param(name))
        for a, b in zip(engine.read_state(name), reference.read_state(name)):
            np.testing.assert_array_equal(a, b)
        # The ranks agree with each other: the largest and the smallest are the same.
        np.testing.assert_array_equal(job.all_reduce(mine, "max"), mine)
        np.testing.assert_array_equal(job.all_reduce(mine, "min"), mine)
    assert engine.layout()["ranks"] == 2
    assert engine.stats()["last_step_comm_bytes"] > 0
    assert engine.memory()["optimizer_states"]["cpu"] < reference.memory()[
        "optimizer_states"]["cpu"]

    # A checkpoint of the job (two ranks' slices) loads into the one-rank engine.
    directory = os.path.join(tempfile.gettempdir(),
                             f"strata-py-zero-ranks-{os.environ['MASTER_PORT']}-{stage}")
    engine.save(directory)
    reference.add_grad("w", np.ones((FEATURES, OUTPUTS), np.float32))
    reference.add_grad("b", np.ones(OUTPUTS, np.float32))
    reference.step()
    reference.load(directory)
    for name in ("w", "b"):
        np.testing.assert_array_equal(reference.read_param(name), engine.read_param(name))
    job.barrier()  # every rank has read it
    if rank == 0:
        shutil.rmtree(directory)
