"""strata.torch.zero_shard of a module built on the meta device (strata/zero_meta.py): its
parameters' values drawn by name from param_init as the engine is created train bitwise as
the same module materialized; tied parameters stay tied; the errors name the parameter."""

import pytest
import torch
from torch import nn

import strata
import strata.torch as st
from conftest import solo_communicator


class Tied(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.embed = nn.Embedding(16, 8, device=device)
        self.mid = nn.Linear(8, 8, device=device)
        self.head = nn.Linear(8, 16, bias=False, device=device)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mid(self.embed(tokens))))


def values_by_name(name, shape):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randn(shape, generator=g) * 0.3


def materialized():
    net = Tied()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(values_by_name(name, tuple(p.shape)))
    return net


def train(model, steps=6):
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(16, (4, 10), generator=g)
    losses = []
    for _ in range(steps):
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 16), tokens[:, 1:].reshape(-1))
        loss.backward()
        model.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("stage", [1, 3])
def test_meta_module_trains_as_the_materialized_one(runtime, comm, stage):
    args = dict(stage=stage, reduce_policy=st.ReducePolicy(bucket_bytes="1KiB"),
                fetch_policy=st.FetchPolicy(persist_below_bytes=0),
                optimizer=st.ZeroAdamW(lr=1e-2, max_grad_norm=1.0))
    seen = []

    def param_init(name, shape):
        seen.append((name, shape))
        return values_by_name(name, shape)

    net = Tied(device="meta")
    model = st.zero_shard(net, comm, param_init=param_init, **args)
    # Each parameter once, under its first name (the tied head is the embedding's).
    assert seen == [("embed.weight", (16, 8)), ("mid.weight", (8, 8)), ("mid.bias", (8,))]
    assert net.head.weight is net.embed.weight and not net.embed.weight.is_meta
    assert net.embed.weight.device == torch.device("cpu")
    losses = train(model)
    full = model.full_state_dict()
    model.close()

    other = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB", nvme_paths=None)
    plain = st.zero_shard(materialized(), solo_communicator(other), **args)
    assert train(plain) == losses  # bitwise
    for name, value in plain.full_state_dict().items():
        assert torch.equal(full[name], value), name
    plain.close()


def test_meta_errors(runtime, comm):
    with pytest.raises(ValueError, match=r"parameter 'weight' of Embedding is on the meta device: "
                                         r"pass param_init=fn\(name, shape\)"):
        st.zero_shard(Tied(device="meta"), comm)
    with pytest.raises(ValueError, match=r"param_init\('mid.bias', \(8,\)\) gave 3 values; the "
                                         r"parameter has 8"):
        st.zero_shard(Tied(device="meta"), comm,
                      param_init=lambda n, s: torch.zeros(3) if n == "mid.bias" else torch.zeros(s))
    net = nn.BatchNorm1d(4, device="meta")
    with pytest.raises(ValueError, match=r"buffer 'running_mean' is on the meta device"):
        st.zero_shard(net, comm, param_init=lambda n, s: torch.zeros(s))


def test_meta_values_are_drawn_one_at_a_time(runtime, comm):
    """The engine draws each meta parameter's values as it sets up its group and lets them go:
    when param_init is called, no value it returned before is still alive (before, zero_shard
    held every parameter's fp32 values at once until the engine had them all)."""
    import weakref
    alive = []
    alive_at_call = []

    def param_init(name, shape):
        alive_at_call.append(sum(1 for ref in alive if ref() is not None))
        # numpy: what zero_shard keeps of it (a flat view) keeps this very object alive.
        value = values_by_name(name, shape).numpy()
        alive.append(weakref.ref(value))
        return value

    model = st.zero_shard(Tied(device="meta"), comm, param_init=param_init, stage=3,
                          reduce_policy=st.ReducePolicy(bucket_bytes="1KiB"))
    assert alive_at_call == [0, 0, 0]
    model.close()


def test_meta_init_errors_name_the_parameter(runtime, comm):
    def param_init(name, shape):
        if name == "mid.weight":
            raise RuntimeError("checkpoint shard 3 is missing")
        return torch.zeros(shape)

    with pytest.raises(strata.Error, match=r"filling the initial values of 'mid.weight'.*"
                                           r"checkpoint shard 3 is missing"):
        st.zero_shard(Tied(device="meta"), comm, param_init=param_init, stage=3)
