"""The overlapped optimizer step from Python: strata.OverlapOptions, OffloadOptimizer(overlap=),
grad_ready's completion hint, and strata.torch's switch (optimizer=ZeroAdamW(overlap_step=...)
to OffloadAdamW and to zero_shard). With overlap the losses, the final weights and the optimizer
states are bit for bit those without, also when clipping bites (the early work rolled back) and
with gradient accumulation; the hints of accumulation_steps keep the early work."""

import copy

import pytest
import torch
from torch import nn

import strata
import strata.torch as st
from conftest import solo_communicator
from strata import zero_policy
from mlp import data, make_mlp

HYPER = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.05)
STEPS = 6


ELEMENTS = sum(p.numel() for p in make_mlp().parameters())


def new_runtime(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    return strata.Runtime(backend="host", gpu_bytes="32MiB", cpu_bytes="32MiB",
                          nvme_paths=[str(path)], nvme_bytes="64MiB", staging_bytes="8MiB")


def test_bindings_expose_the_overlap():
    o = strata.OverlapOptions(enabled=True, max_host_bytes="1MiB")
    assert (o.enabled, o.max_host_bytes) == (True, 1 << 20)
    assert "OverlapOptions(enabled=True, max_host_bytes=1048576)" == repr(o)
    assert strata.OverlapOptions().enabled is False
    with pytest.raises(TypeError, match="OverlapOptions.enabled"):
        o.enabled = 1
    z = strata.ZeroOptions()
    assert z.optimizer.overlap.enabled is False
    z.optimizer.overlap.enabled = True
    z.optimizer.overlap.max_host_bytes = "2MiB"
    assert (z.optimizer.overlap.enabled, z.optimizer.overlap.max_host_bytes) == (True, 2 << 20)
    # The policy object's fields reach ZeroOptions.optimizer.overlap.
    opts = zero_policy.to_options(
        3, optimizer=st.ZeroAdamW(overlap_step=True, overlap_max_host_bytes="4MiB"))
    assert (opts.optimizer.overlap.enabled, opts.optimizer.overlap.max_host_bytes) == \
        (True, 4 << 20)
    with pytest.raises(TypeError, match="ZeroAdamW.overlap_step"):
        st.ZeroAdamW(overlap_step=1)
    with pytest.raises(ValueError, match="ZeroAdamW.overlap_max_host_bytes"):
        st.ZeroAdamW(overlap_max_host_bytes="lots")
    # zero_shard's keywords name the policy object that holds it.
    with pytest.raises(TypeError, match=r"strata.torch.optimizer=ZeroAdamW\(overlap_step=...\)"):
        st.zero_shard(make_mlp(), None, overlap_step=True)


def test_optimizer_hints_and_fields(tmp_path):
    """strata.OffloadOptimizer: completion hints, set_final_micro_step, wait_for_early_steps, and
    the step result's and statistics' overlap fields, on parameters stepped by hand.

    (wait_for_early_steps() may return while the stepper holds the last unit it took from its
    queue, not yet marked running, which step() then drops: so the checks below count on the
    units landed before the last, never on the last.)"""
    rt = new_runtime(tmp_path, "nvme")
    with pytest.raises(strata.InvalidArgumentError, match="overlap=3"):
        strata.OffloadOptimizer(rt, overlap=3)
    opt = strata.OffloadOptimizer(rt, overlap=strata.OverlapOptions(enabled=True), lr=1e-2)
    params = []
    for i in range(4):
        p = rt.create(f"w{i}", (256,), "float32", home="cpu")
        g = rt.create(f"w{i}.grad", (256,), "float32", home="cpu")
        pid = opt.add_param(f"w{i}", p, g, initial_master=torch.linspace(-1, 1, 256))
        params.append((pid, g))

    def land(value, completion=None, which=range(4)):
        for i in which:
            pid, g = params[i]
            with g.acquire("gpu", "w") as view:
                torch.from_dlpack(view).fill_(value)
            opt.grad_ready(pid, completion=completion)

    with pytest.raises(strata.InvalidArgumentError, match="completion='last'"):
        opt.grad_ready(params[0][0], completion="last")
    # Final landings: their Adam runs early and step() keeps it.
    land(0.5, "final")
    opt.wait_for_early_steps()
    result = opt.step()
    assert result["early_elements"] >= 3 * 256 and result["rolled_back"] is False
    s = opt.stats()
    assert s["overlap_early_steps"] == 1 and s["last_early_elements"] == result["early_elements"]
    assert s["overlap_rollbacks"] == 0 and s["overlap_host_bytes"] > 0
    for field in ("last_redone_elements", "last_early_adam_ns", "last_rollback_ns",
                  "last_early_wait_ns", "overlap_budget_misses", "nvme_state_bytes"):
        assert isinstance(s[field], int)
    # Partial micro-steps ('more', or set_final_micro_step(False)) start nothing: landing
    # again after them rolls nothing back.
    land(0.25, "more")
    opt.set_final_micro_step(False)
    land(0.25)
    opt.wait_for_early_steps()
    opt.set_final_micro_step(True)
    land(0.25)  # the default is final again: the sums (0.75) step early
    opt.wait_for_early_steps()
    result = opt.step()
    assert result["early_elements"] >= 3 * 256 and not result["rolled_back"]
    # A landing after its parameter's early step: that parameter is rolled back and redone in
    # step(); the others' early work stands (the fourth's too, if it ran).
    land(0.5, "final")
    opt.wait_for_early_steps()
    land(0.5, "final", which=[0])
    result = opt.step()
    assert result["rolled_back"] is True and 2 * 256 <= result["early_elements"] <= 3 * 256
    assert opt.stats()["overlap_rollbacks"] == 1 and opt.stats()["last_redone_elements"] == 256


def train_offload(rt, overlap, state_home, accumulation, max_grad_norm, drain):
    """OffloadAdamW training; returns the losses, the final parameters, the optimizer states
    and the step results."""
    x, y = data()
    model = st.offload(make_mlp(), rt, home="cpu")
    opt = st.OffloadAdamW(
        model, optimizer=st.ZeroAdamW(max_grad_norm=max_grad_norm, overlap_step=overlap, **HYPER),
        offload_policy=st.OffloadPolicy(state_home=state_home),
        reduce_policy=st.ReducePolicy(accumulation_steps=accumulation))
    losses, results = [], []
    for step in range(STEPS):
        total = 0.0
        for xm, ym in zip(x.chunk(accumulation), y.chunk(accumulation)):
            loss = nn.functional.mse_loss(model(xm), ym) / accumulation
            loss.backward()
            total += loss.item()
            # Every other step lets the early work finish before the next landing or step().
            if drain and step % 2 == 0:
                opt.optimizer.wait_for_early_steps()
        results.append(opt.step())
        opt.zero_grad()
        losses.append(total)
    params = {name: model.read_parameter(name) for name, _ in make_mlp().named_parameters()}
    states = [opt.optimizer.read_state(prm.pid) for prm in model._params]
    return losses, params, states, results


@pytest.mark.parametrize("state_home,accumulation,max_grad_norm", [
    ("cpu", 1, 0.0), ("cpu", 3, 0.0), ("cpu", 2, 0.05), ("nvme", 1, 0.05), ("nvme", 3, 0.0)])
def test_offload_adamw_overlap_is_bitwise(tmp_path, state_home, accumulation, max_grad_norm):
    plain = train_offload(new_runtime(tmp_path, "a"), False, state_home, accumulation,
                          max_grad_norm, drain=False)
    over = train_offload(new_runtime(tmp_path, "b"), True, state_home, accumulation,
                         max_grad_norm, drain=True)
    assert plain[0] == over[0]  # losses, bit for bit
    for name, value in plain[1].items():
        assert torch.equal(value, over[1][name]), name
    for a, b in zip(plain[2], over[2]):
        for x, y in zip(a, b):
            assert bytes(memoryview(x)) == bytes(memoryview(y))
    for r in plain[3]:
        assert r["early_elements"] == 0 and r["rolled_back"] is False
    drained = over[3][0::2]
    if max_grad_norm > 0:
        # The clip bites every step: what ran early is rolled back and redone.
        assert all(r["clip_coef"] < 1 for r in over[3])
        assert all(r["rolled_back"] and r["early_elements"] == 0 for r in drained), over[3]
    else:
        # The hints of accumulation_steps: the partial micro-steps start nothing, the last
        # one's landings step early (all but perhaps the last: see above), nothing is rolled
        # back. Without the hints the drained steps roll back.
        assert not any(r["rolled_back"] for r in over[3]), over[3]
        assert all(r["early_elements"] > 0 for r in drained), over[3]


def test_offload_adamw_checks_its_arguments(runtime):
    model = st.offload(make_mlp(), runtime)
    with pytest.raises(TypeError, match="overlap_step"):
        st.OffloadAdamW(model, optimizer=st.ZeroAdamW(overlap_step="yes"))
    with pytest.raises(ValueError, match="accumulation_steps"):
        st.OffloadAdamW(model, reduce_policy=st.ReducePolicy(accumulation_steps=0))


def train_zero(rt, stage, overlap, accumulation, max_grad_norm):
    x, y = data()
    model = st.zero_shard(make_mlp(), solo_communicator(rt), stage=stage,
                          reduce_policy=st.ReducePolicy(bucket_bytes="4KiB",
                                                        accumulation_steps=accumulation),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0),
                          optimizer=st.ZeroAdamW(max_grad_norm=max_grad_norm,
                                                 overlap_step=overlap, **HYPER))
    assert model.engine.options.optimizer.overlap.enabled is overlap
    losses, results = [], []
    for _ in range(STEPS):
        total = 0.0
        for xm, ym in zip(x.chunk(accumulation), y.chunk(accumulation)):
            loss = nn.functional.mse_loss(model(xm), ym) / accumulation
            loss.backward()
            total += loss.item()
        results.append(model.step())
        model.zero_grad()
        losses.append(total)
    stats = model.engine.optimizer_stats()
    state = model.full_state_dict()
    model.close()
    return losses, state, results, stats


@pytest.mark.parametrize("stage,accumulation,max_grad_norm", [
    (1, 2, 0.0), (2, 1, 0.05), (3, 1, 0.0), (3, 2, 0.05)])
def test_zero_shard_overlap_is_bitwise(tmp_path, stage, accumulation, max_grad_norm):
    plain = train_zero(new_runtime(tmp_path, "a"), stage, False, accumulation, max_grad_norm)
    over = train_zero(new_runtime(tmp_path, "b"), stage, True, accumulation, max_grad_norm)
    assert plain[0] == over[0]
    assert list(plain[1]) == list(over[1])
    for name, value in plain[1].items():
        assert torch.equal(value, over[1][name]), name
    assert plain[3]["overlap_early_steps"] == 0 and plain[3]["overlap_rollbacks"] == 0
    if max_grad_norm > 0:
        assert all(r["clip_coef"] < 1 and r["early_elements"] == 0 for r in over[2])
    elif accumulation == 1:
        # One landing a step and no clip: nothing to roll back.
        assert over[3]["overlap_rollbacks"] == 0
        assert not any(r["rolled_back"] for r in over[2])
