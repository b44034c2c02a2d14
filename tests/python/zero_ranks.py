"""Every rank of a strata-run job (CTest python.zero_ranks_2:
`strata-run -n 2 python3 -m pytest tests/python/zero_ranks.py`) trains a linear regression with
strata.ZeroEngine at stages 1, 2 and 3, each rank on its half of the batch, and checks its
losses and parameters against a one-rank run in the same process (a job of its own) fed the
ranks' averaged gradient: bitwise, so every rank agrees with the others too (also checked
through the communicator). Then strata.torch.zero_shard() at stages 2 and 3: an MLP trained on
each rank's half of the batch has the losses of torch's AdamW on the whole batch in one process,
and its sharded checkpoint loads into a one-rank ZeroModule. Not collected by the one-process
run (the name is not test_*.py)."""

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
    # Stage 3: both parameters partitioned (no persistence threshold).
    return strata.ZeroEngine(comm.runtime, comm,
                             [("w", (FEATURES, OUTPUTS), w0), ("b", (OUTPUTS,), None)],
                             stage=stage, param_dtype="float32", grad_dtype="float32",
                             bucket_bytes=64, alignment=4, param_home="cpu", lr=0.05,
                             betas=(0.9, 0.99), weight_decay=0.01, persist_below_bytes=0)


@pytest.mark.parametrize("stage", [1, 2, 3])
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
    if stage == 3:  # each rank holds half of the parameters, gathered for each read
        assert engine.memory()["params"]["cpu"] < reference.memory()["params"]["cpu"]
        assert engine.stats()["fetches"] > 0
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


def make_mlp():
    import torch
    from torch import nn
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 16), nn.GELU(),
                         nn.Linear(16, OUTPUTS))


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_shard_matches_torch_on_the_whole_batch(job, solo, stage):
    import torch
    from torch import nn
    import strata.torch as st
    rank, ranks = job.rank, job.size
    x, y, _ = data()
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    half = BATCH // ranks
    mine = slice(rank * half, (rank + 1) * half)
    hyper = dict(lr=0.01, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
    reference = make_mlp()
    reference_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **hyper)
    model = st.zero_shard(make_mlp(), job, stage=stage,
                          reduce_policy=st.ReducePolicy(bucket_bytes=1024, alignment=4),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0,
                                                      max_live_bytes=8 << 10),
                          optimizer=st.ZeroAdamW(**hyper))
    for step in range(STEPS):
        loss = nn.functional.mse_loss(model(x[mine]), y[mine])
        loss.backward()
        assert model.step()["step"] == step + 1
        total = job.all_reduce(np.array([loss.item()], np.float64))[0] / ranks
        want = nn.functional.mse_loss(reference(x), y)
        want.backward()
        reference_opt.step()
        reference_opt.zero_grad()
        # The ranks' gradients are summed in another order than one process's: not bitwise.
        assert total == pytest.approx(want.item(), rel=1e-5), f"step {step}"
    if stage == 3:
        assert 0 < model.stats()["gathered_peak_bytes"] <= 8 << 10
    full = model.full_state_dict()
    if rank == 0:
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(full[name], value, rtol=1e-4, atol=1e-6)
    else:
        assert full == {}

    # Saved at two ranks, loaded at one: the same parameters.
    directory = os.path.join(tempfile.gettempdir(),
                             f"strata-py-zero-shard-{os.environ['MASTER_PORT']}-{stage}")
    model.save_sharded(directory)
    one = st.zero_shard(make_mlp(), solo, stage=3,
                        fetch_policy=st.FetchPolicy(persist_below_bytes=0))
    one.load_sharded(directory)
    for prm_name, _ in make_mlp().named_parameters():
        np.testing.assert_array_equal(one.read_parameter(prm_name).numpy(),
                                      model.read_parameter(prm_name).numpy())
    one.close()
    model.close()
    job.barrier()  # every rank has read it
    if rank == 0:
        shutil.rmtree(directory)
