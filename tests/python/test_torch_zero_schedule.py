"""A learning-rate schedule on strata's ZeRO engine: ZeroModule.set_lr before each step (a
linear warm-up) trains as torch's AdamW under LambdaLR, fp32, stages 1 and 3; model.lr reads
it back; the engine's set_lr / set_group / group and their errors."""

import copy
import math

import pytest
import torch
from torch import nn

import strata
import strata.torch as st
from mlp import data, make_mlp

HYPER = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.05)
WARMUP = 4


def warm(i: int) -> float:
    """LambdaLR's factor at step i (0-based): linear to 1 over WARMUP steps, then constant."""
    return min(1.0, (i + 1) / WARMUP)


def close_to(got, want, rel):
    return all(math.isclose(a, b, rel_tol=rel) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_module_warm_up_matches_torch_lambda_lr(runtime, comm, stage):
    x, y = data()
    reference = make_mlp()
    constant = copy.deepcopy(reference)
    model = st.zero_shard(copy.deepcopy(reference), comm, stage=stage,
                          reduce_policy=st.ReducePolicy(bucket_bytes="4KiB"),
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0) if stage == 3
                          else None,
                          optimizer=st.ZeroAdamW(**HYPER))
    ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **HYPER)
    sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, warm)
    const_opt = torch.optim.AdamW(constant.parameters(), foreach=False, **HYPER)
    assert model.lr == pytest.approx(HYPER["lr"], rel=1e-7)
    losses, ref_losses, const_losses = [], [], []
    for i in range(10):
        model.set_lr(HYPER["lr"] * warm(i))
        assert model.lr == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-7)  # float32
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        model.step()
        losses.append(loss.item())
        for net, opt, out in ((reference, ref_opt, ref_losses), (constant, const_opt,
                                                                  const_losses)):
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        sched.step()
    # The tolerance of test_torch_zero.py: only the AdamW arithmetic differs.
    assert close_to(losses, ref_losses, 1e-5), (losses, ref_losses)
    # The schedule mattered: without it the losses part from step 2 on by far more.
    assert not close_to(losses[1:], const_losses[1:], 1e-3), (losses, const_losses)
    full = model.full_state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=1e-4, atol=1e-6)
    assert model.engine.group(0)["lr"] == pytest.approx(HYPER["lr"], rel=1e-7)
    model.close()


def test_zero_module_set_lr_leaves_frozen_parameters_alone(runtime, comm):
    net = make_mlp()
    net[0].weight.requires_grad_(False)  # registered in group 1, lr 0
    model = st.zero_shard(net, comm, stage=2, optimizer=st.ZeroAdamW(**HYPER))
    before = model.read_parameter("0.weight").clone()
    model.set_lr(1e-2)
    x, y = data()
    nn.functional.mse_loss(model(x), y).backward()
    model.step()
    assert model.lr == pytest.approx(1e-2, rel=1e-7)
    assert model.engine.group(1)["lr"] == 0.0
    assert torch.equal(model.read_parameter("0.weight"), before)
    model.close()


def test_zero_engine_set_group_and_errors(runtime, comm):
    engine = strata.ZeroEngine(runtime, comm, [("w", (8,), torch.ones(8)), ("b", (2,), None, 1)],
                               stage=2, lr=1e-3, groups=[{}, {"lr": 5e-4}])
    assert engine.group()["lr"] == pytest.approx(1e-3, rel=1e-7)
    engine.set_lr(2e-3)
    assert engine.group(0)["lr"] == pytest.approx(2e-3, rel=1e-7)
    engine.set_lr(1e-4, group=1)
    engine.set_group(1, weight_decay=0.25, betas=(0.8, 0.9))
    g = engine.group(1)
    assert g["lr"] == pytest.approx(1e-4, rel=1e-7)
    assert g["weight_decay"] == 0.25 and g["betas"] == pytest.approx((0.8, 0.9))
    with pytest.raises(strata.NotFoundError, match="no hyper-parameter group 2; the engine has 2"):
        engine.set_lr(1e-3, group=2)
    with pytest.raises(strata.NotFoundError, match="no hyper-parameter group 2"):
        engine.group(2)
    with pytest.raises(strata.InvalidArgumentError, match="lr"):
        engine.set_lr(-1.0)
    with pytest.raises(ValueError, match="'momentum' is not a group setting"):
        engine.set_group(0, momentum=0.9)
    assert engine.group(0)["lr"] == pytest.approx(2e-3, rel=1e-7)  # unchanged by the errors
