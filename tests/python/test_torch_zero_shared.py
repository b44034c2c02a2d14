"""strata.torch.zero_shard with parameters that get their gradient more than once in one
backward: a block applied twice (weights shared across depth) and weights tied between two
units, each in checkpointed segments (torch.utils.checkpoint, reentrant or not) or not, at
stages 1, 2 and 3, against plain torch. A parameter used by more than one module call keeps
its gradient in param.grad until backward ends (zero_torch.py's held path); the others go to
the engine as they arrive."""

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import strata
import strata.torch as st
from conftest import solo_communicator

HYPER = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.05)
D = 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, 2 * D)
        self.down = nn.Linear(2 * D, D)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


def run(segment, x, mode):
    """segment(x), checkpointed as `mode` says (None: not)."""
    if mode is None:
        return segment(x)
    return checkpoint(segment, x, use_reentrant=mode == "reentrant")


class Reused(nn.Module):
    """One block applied twice (ALBERT-style sharing across depth), each application its own
    checkpointed segment."""

    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(5)
        self.inp = nn.Linear(8, D)  # so that the segments' input requires grad (reentrant)
        self.block = Block()
        self.head = nn.Linear(D, 4)
        self.mode = mode

    def forward(self, x):
        h = self.inp(x)
        h = run(self.block, h, self.mode)
        h = run(self.block, h, self.mode)
        return self.head(h)


class TiedAcross(nn.Module):
    """Two layers, two units, one weight: each in a checkpointed segment of its own."""

    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(6)
        self.inp = nn.Linear(8, D)
        self.a = nn.Linear(D, D)
        self.b = nn.Linear(D, D)
        self.b.weight = self.a.weight
        self.head = nn.Linear(D, 4)
        self.mode = mode

    def forward(self, x):
        h = self.inp(x)
        h = run(lambda t: torch.tanh(self.a(t)), h, self.mode)
        h = run(lambda t: torch.tanh(self.b(t)), h, self.mode)
        return self.head(h)


def data():
    g = torch.Generator().manual_seed(11)
    return torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)


def host_runtime():
    return strata.Runtime(backend="host", gpu_bytes="16MiB", cpu_bytes="16MiB", nvme_paths=None)


STEPS = 4


@pytest.mark.parametrize("mode", [None, "reentrant", "non-reentrant"])
@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("make,shared", [(Reused, 4), (TiedAcross, 1)])
def test_shared_parameters_match_torch(make, shared, stage, mode):
    x, y = data()
    reference = make(mode)
    ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **HYPER)
    model = st.zero_shard(copy.deepcopy(reference), solo_communicator(host_runtime()),
                          stage=stage, reduce_policy=st.ReducePolicy(bucket_bytes="2KiB"),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0,
                                                      reuse_window_bytes=0),
                          optimizer=st.ZeroAdamW(**HYPER))
    losses, want = [], []
    for _ in range(STEPS):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        model.step()
        losses.append(loss.item())
        ref = F.mse_loss(reference(x), y)
        ref.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        want.append(ref.item())
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(losses, want)), (losses, want)
    full = model.full_state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=1e-4, atol=1e-6)
    # The held path ran for the shared parameters (Reused: the block's 4; TiedAcross: the
    # tied weight), once per backward, and for no other: those went as they came.
    assert model._held_pushes == shared * STEPS
    assert all(p.grad is None for p in model.module.parameters())
    assert all(not prm.acquisitions and prm.uses == 0 for prm in model._params)
    model.close()


def test_no_sharing_holds_nothing():
    """A model without shared parameters pushes every gradient as it arrives, checkpointed or
    not (reduce-scatters overlap backward as before)."""
    x, y = data()

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, D)
            self.blocks = nn.ModuleList(Block() for _ in range(2))
            self.head = nn.Linear(D, 4)

        def forward(self, t):
            t = self.inp(t)
            for b in self.blocks:
                t = checkpoint(b, t, use_reentrant=True)
            return self.head(t)

    model = st.zero_shard(Plain(), solo_communicator(host_runtime()), stage=2,
                          units=[Block], reduce_policy=st.ReducePolicy(bucket_bytes="2KiB"))
    for _ in range(2):
        F.mse_loss(model(x), y).backward()
        model.step()
    assert model._held_pushes == 0
    model.close()

