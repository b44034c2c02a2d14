"""strata.torch.zero_shard() in one process (a job of one rank): an nn.Module trained at ZeRO
stages 1, 2 and 3 against torch's AdamW in memory; units, tied, frozen and unused parameters,
gradient accumulation, evaluation without autograd, state dicts. Several ranks:
zero_ranks.py (CTest python.zero_ranks_2) and examples/torch_trainer (examples.torch_trainer_zero*).
"""

import copy
import math
import os

import pytest
import torch
from torch import nn

import strata
import strata.torch as st
from conftest import solo_communicator
from mlp import data, make_mlp

HYPER = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.05)


def train(model, step, steps, x, y, zero=None):
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        step()
        if zero is not None:
            zero()
        losses.append(loss.item())
    return losses


def close_to(got, want, rel):
    return all(math.isclose(a, b, rel_tol=rel) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("stage,param_home", [(1, "gpu"), (2, "cpu"), (3, "gpu"), (3, "nvme")])
def test_zero_shard_matches_torch_adamw(runtime, comm, stage, param_home):
    x, y = data()
    reference = make_mlp()
    ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **HYPER)
    # Stage 3: every parameter partitioned, one layer's groups gathered at a time at most.
    model = st.zero_shard(copy.deepcopy(reference), comm, stage=stage,
                          offload_policy=st.OffloadPolicy(param_home=param_home),
                          reduce_policy=st.ReducePolicy(bucket_bytes="4KiB"),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0,
                                                      max_live_bytes="12KiB",
                                                      prefetch_bytes="4KiB",
                                                      reuse_window_bytes="4KiB"),
                          optimizer=st.ZeroAdamW(**HYPER))
    assert model.engine.stage == stage and model.world_size == 1
    assert [name for name, _ in model.units] == ["0", "2", "4"]
    losses = train(model, model.step, 20, x, y)
    ref_losses = train(reference, ref_opt.step, 20, x, y, ref_opt.zero_grad)
    # The same forward and backward; only the AdamW arithmetic differs (strata's CPU kernel).
    assert close_to(losses, ref_losses, 1e-5), (losses, ref_losses)
    assert losses[-1] < 0.9 * losses[0]
    # Nothing stays acquired between steps; the torch parameters are placeholders.
    for p in model.module.parameters():
        assert p.numel() == 0 and p.grad is None
    assert all(not prm.acquisitions for prm in model._params)
    full = model.full_state_dict()
    assert list(full) == list(reference.state_dict())
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=1e-4, atol=1e-6)
    optimizer = model.full_optimizer_state_dict()
    assert optimizer["step"] == 20
    for (name, p) in reference.named_parameters():
        torch.testing.assert_close(optimizer["state"][name]["exp_avg"].reshape(p.shape),
                                   ref_opt.state[p]["exp_avg"], rtol=1e-3, atol=1e-7)
    stats = model.stats()
    assert stats["steps"] == 20
    if stage == 3:
        assert stats["fetches"] > 0 and stats["gathers_prefetched"] > 0
        assert 0 < stats["gathered_peak_bytes"] <= 12 << 10
        assert model.memory()["params"][param_home] > 0
    model.close()


def test_gradients_reach_the_engine_during_backward(runtime, comm):
    x, y = data()
    model = st.zero_shard(make_mlp(), comm, stage=2,
                          reduce_policy=st.ReducePolicy(bucket_bytes="4KiB"),
                          optimizer=st.ZeroAdamW(**HYPER))
    groups = model.engine.layout()["groups"]
    before = model.stats()["reduce_scatters"]
    seen = []

    def probe(module, inputs, output):  # the first layer's backward is the last to run
        output.register_hook(lambda grad: seen.append(model.stats()["reduce_scatters"]))

    model.module[0].register_forward_hook(probe)
    nn.functional.mse_loss(model(x), y).backward()
    # Groups were reduce-scattered during backward, as their gradients came (the later layers'
    # before the first layer's backward began), every one of them before step().
    assert before < seen[0] < before + groups
    assert model.stats()["reduce_scatters"] - before == groups
    assert model.step()["step"] == 1
    model.close()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Tied(nn.Module):
    """Embedding and head share a weight; a frozen LayerNorm; a layer forward never uses."""

    def __init__(self, vocab=24, d=16):
        super().__init__()
        torch.manual_seed(99)
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(2))
        self.frozen = nn.LayerNorm(d)
        self.frozen.weight.requires_grad_(False)
        self.frozen.bias.requires_grad_(False)
        self.unused = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.frozen(x))


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       tokens[:, 1:].reshape(-1))


@pytest.mark.parametrize("units", [None, (Block,), [Block], {Block}])
def test_tied_frozen_and_unused_parameters(runtime, comm, units):
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(24, (8, 12), generator=g)
    hyper = dict(HYPER, weight_decay=0.0)  # torch skips gradient-less parameters entirely
    reference = Tied()
    ref_opt = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad],
                                foreach=False, **hyper)
    model = st.zero_shard(Tied(), comm, stage=3, units=units,
                          reduce_policy=st.ReducePolicy(bucket_bytes="2KiB"),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0),
                          optimizer=st.ZeroAdamW(**hyper))
    names = [name for name, _ in model.units]
    if units is None:
        assert names == ["embed", "blocks.0.norm", "blocks.0.up", "blocks.0.down",
                         "blocks.1.norm", "blocks.1.up", "blocks.1.down", "frozen", "unused",
                         "head"]
    else:
        assert names == ["", "blocks.0", "blocks.1"]  # the root holds the rest
    assert "head.weight" not in model.engine.params  # registered once, as embed.weight
    losses, ref_losses = [], []
    for _ in range(8):
        loss = lm_loss(model, tokens)
        loss.backward()
        model.step()
        ref_loss = lm_loss(reference, tokens)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(loss.item())
        ref_losses.append(ref_loss.item())
    assert close_to(losses, ref_losses, 1e-5), (losses, ref_losses)
    full = model.full_state_dict()
    assert full["head.weight"] is full["embed.weight"] or torch.equal(full["head.weight"],
                                                                      full["embed.weight"])
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=1e-4, atol=1e-6)
    # Frozen and unused parameters keep their initial values exactly.
    initial = Tied().state_dict()
    for name in ("frozen.weight", "frozen.bias", "unused.weight", "unused.bias"):
        assert torch.equal(full[name], initial[name]), name
    model.close()


def test_gradient_accumulation(runtime, comm):
    x, y = data(64)
    reference = make_mlp()
    ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **HYPER)
    model = st.zero_shard(make_mlp(), comm, stage=3,
                          reduce_policy=st.ReducePolicy(accumulation_steps=2, bucket_bytes="4KiB"),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0),
                          optimizer=st.ZeroAdamW(**HYPER))
    for _ in range(5):
        for wrapped in (model, reference):  # two micro-batches a step; gradients summed
            for half in (slice(0, 32), slice(32, 64)):
                nn.functional.mse_loss(wrapped(x[half]), y[half]).backward()
        model.step()
        ref_opt.step()
        ref_opt.zero_grad()
    full = model.full_state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=1e-4, atol=1e-6)
    model.close()


def test_evaluation_releases_unit_by_unit(runtime, comm):
    model = st.zero_shard(make_mlp(), comm, stage=3,
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0))
    x, _ = data()
    held = []

    def probe(module, inputs):  # after the wrapper's own pre-hook
        held.append(sum(1 for prm in model._params if prm.acquisitions))

    for layer in model.module:
        layer.register_forward_pre_hook(probe)
    with torch.no_grad():
        out = model(x)
    assert out.shape == (64, 4)
    # Each layer's own parameters (weight, bias) while it runs, none of the others'.
    assert held == [2, 0, 2, 0, 2]
    assert all(not prm.acquisitions for prm in model._params)
    # A unit called outside the wrapper with autograd on would let autograd keep memory the
    # wrapper releases: refused. Without autograd it is fine.
    with pytest.raises(RuntimeError, match=r"unit '0' of a ZeroModule ran outside"):
        model.module[0](x)
    assert all(not prm.acquisitions for prm in model._params)
    with torch.no_grad():
        assert model.module[0](x).shape == (64, 64)
    with pytest.raises(RuntimeError, match=r"full_state_dict\(\)"):
        model.state_dict()
    model.close()


def test_sharded_checkpoint_resumes_bitwise(runtime, comm, tmp_path):
    x, y = data()
    model = st.zero_shard(make_mlp(), comm, stage=3,
                          reduce_policy=st.ReducePolicy(bucket_bytes="4KiB"),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=256),
                          optimizer=st.ZeroAdamW(**HYPER))
    train(model, model.step, 3, x, y)
    model.save_sharded(tmp_path / "ckpt")
    after = train(model, model.step, 3, x, y)
    model.load_sharded(tmp_path / "ckpt")
    assert model.engine.step_count == 3
    assert train(model, model.step, 3, x, y) == after
    model.close()
    # Into another model (another runtime: one engine per runtime) at stage 2.
    other = strata.Runtime(backend="host", gpu_bytes="8MiB", cpu_bytes="8MiB", nvme_paths=None)
    again = st.zero_shard(make_mlp(), solo_communicator(other), stage=2,
                          optimizer=st.ZeroAdamW(**HYPER))
    again.load_sharded(tmp_path / "ckpt")
    assert train(again, again.step, 3, x, y) == after
    again.close()


def test_zero_shard_errors(runtime, comm):
    with pytest.raises(ValueError, match=r"has no Runtime"):
        st.zero_shard(make_mlp(), solo_communicator(None))
    with pytest.raises(ValueError, match=r"MixedPrecisionPolicy.param_dtype=torch.int8"):
        st.zero_shard(make_mlp(), comm, mp_policy=st.MixedPrecisionPolicy(param_dtype=torch.int8))
    with pytest.raises(TypeError, match=r"units='blocks': use None, a module class, a list"):
        st.zero_shard(make_mlp(), comm, units="blocks")
    # A collection of classes (a list as well as a tuple): anything else in it is named.
    with pytest.raises(TypeError, match=r"units=\[<class .*Block'>, 'Linear'\]: 'Linear' \(str\) "
                                        r"is not a class; list module classes"):
        st.zero_shard(make_mlp(), comm, units=[Block, "Linear"])
    with pytest.raises(TypeError, match=r"Linear\(in_features=2, out_features=2, bias=True\) "
                                        r"\(Linear\) is not a class"):
        st.zero_shard(make_mlp(), comm, units=(nn.Linear(2, 2),))
    with pytest.raises(TypeError, match=r"units=\[\] names no class"):
        st.zero_shard(make_mlp(), comm, units=[])
    with pytest.raises(ValueError, match=r"FetchPolicy.order='sideways'"):
        st.zero_shard(make_mlp(), comm, fetch_policy=st.FetchPolicy(order="sideways"))
    with pytest.raises(ValueError, match=r"stage=4: use 1, 2 or 3"):
        st.zero_shard(make_mlp(), comm, stage=4)
    # The module order, given up front: the first step prefetches along it (where the real
    # uses depart from it, a group shared by two layers, the engine realigns) and records the
    # real order for the next.
    x, y = data()
    model = st.zero_shard(make_mlp(), comm, stage=3,
                          fetch_policy=st.FetchPolicy(order="module", persist_below_bytes=0),
                          reduce_policy=st.ReducePolicy(bucket_bytes="4KiB"),
                          optimizer=st.ZeroAdamW(**HYPER))
    train(model, model.step, 1, x, y)
    first = model.stats()
    assert first["gathers_prefetched"] > 0
    train(model, model.step, 1, x, y)
    assert model.stats()["order_changes"] == first["order_changes"]
    model.close()


def test_backward_never_reads_released_parameters(runtime, comm):
    # Stage 3 with nothing kept: after forward every gathered group is dropped. The memory the
    # forward used is then filled with NaN and held (so that backward's gathers land
    # elsewhere): any autograd reference to it (nn.Linear's saved transposed weight) would
    # produce NaN. The saved-tensor hooks make backward read the parameters it gathers again.
    x, y = data()
    reference = make_mlp()
    model = st.zero_shard(copy.deepcopy(reference), comm, stage=3,
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0,
                                                      reuse_window_bytes=0, prefetch_bytes=0),
                          reduce_policy=st.ReducePolicy(bucket_bytes="4KiB"),
                          optimizer=st.ZeroAdamW(**HYPER))
    used = []

    def probe(module, inputs):  # after the wrapper's pre-hook: the gathered weight
        used.append((module.weight.data_ptr(), module.weight.numel() * 4))

    for layer in (model.module[0], model.module[2], model.module[4]):
        layer.register_forward_pre_hook(probe)
    loss = nn.functional.mse_loss(model(x), y)
    # Every group is dropped (its memory may still be retiring: returned once the work that
    # used it has ended, which the engine sees at its next call).
    assert model.memory()["gathered"] == 0
    held, spare = [], []
    for size in (16384, 256, 16):
        while True:
            try:
                t = runtime.create(f"poison{len(held) + len(spare)}", (size,), "float32",
                                   home="gpu")
            except strata.ResourceExhaustedError:
                break
            with t.acquire("gpu", "w") as view:
                data_ = torch.from_dlpack(view)
                data_.fill_(float("nan"))
                lo, hi = data_.data_ptr(), data_.data_ptr() + 4 * data_.numel()
                covers = any(lo < p + n and p < hi for p, n in used)
                del data_
            (held if covers else spare).append(t)
    assert held  # the forward's memory is poisoned and taken
    for t in spare:
        t.destroy()
    loss.backward()
    result = model.step()
    want = nn.functional.mse_loss(reference(x), y)
    want.backward()
    assert math.isfinite(result["grad_norm"])
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in reference.parameters()))
    assert result["grad_norm"] == pytest.approx(norm.item(), rel=1e-5)
    assert loss.item() == want.item()
    for t in held:
        t.destroy()
    model.close()


def test_default_max_live_bytes_fits_the_tier_silently(runtime, comm, capfd):
    """Every default at stage 3: max_live_bytes is automatic (the engine fits it to the GPU
    tier: 32 MiB here, below the 1 GiB it starts from) and says nothing. A value set above
    what the tier holds is lowered the same way, with a warning naming it."""
    if os.environ.get("STRATA_LOG", "").lower() == "error":
        pytest.skip("STRATA_LOG=error hides strata's warnings")
    x, y = data()
    capfd.readouterr()
    model = st.zero_shard(make_mlp(), comm)
    assert model.engine.options.max_live_bytes is None and model.fetch_policy.max_live_bytes is None
    train(model, model.step, 2, x, y)
    model.close()
    assert "max_live_bytes" not in capfd.readouterr().err
    # 999 MiB: a message no other test prints (strata warns once per message and process).
    other = strata.Runtime(backend="host", gpu_bytes="32MiB", cpu_bytes="32MiB", nvme_paths=None)
    model = st.zero_shard(make_mlp(), solo_communicator(other),
                          fetch_policy=st.FetchPolicy(max_live_bytes="999MiB"))
    assert model.engine.options.max_live_bytes == 999 << 20
    train(model, model.step, 2, x, y)
    model.close()
    err = capfd.readouterr().err
    assert err.count(f"max_live_bytes = {999 << 20} is more than the gpu tier can hold") == 1, err
