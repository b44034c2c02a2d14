"""strata.torch: an nn.Module trained with its parameters in strata, against torch's AdamW."""

import copy
import io
import os

import pytest
import torch
from torch import nn

import strata
import strata.torch as st
from mlp import data, make_mlp


HYPER = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.05)


def train(model, opt, steps, x, y):
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("home,order,state_home", [("cpu", "record", "cpu"),
                                                   ("nvme", "module", "nvme"),
                                                   ("nvme", "record", "cpu")])
def test_mlp_matches_torch_adamw(runtime, home, order, state_home):
    x, y = data(128)
    reference = make_mlp()
    model = copy.deepcopy(reference)
    wrapped = st.offload(model, runtime, home=home, order=order)
    assert runtime.stats()["schedule"]["given_order"] == (order == "module")
    opt = st.OffloadAdamW(wrapped, optimizer=st.ZeroAdamW(**HYPER),
                          offload_policy=st.OffloadPolicy(state_home=state_home))
    ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **HYPER)
    losses = train(wrapped, opt, 20, x, y)
    ref_losses = train(reference, ref_opt, 20, x, y)
    for step, (got, want) in enumerate(zip(losses, ref_losses)):
        assert got == pytest.approx(want, rel=1e-4), f"step {step}: {got} vs {want}"
    assert losses[-1] < losses[0]
    # The parameters in strata are the reference's.
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert p.numel() == 0  # the torch parameter is only a placeholder between steps
        torch.testing.assert_close(wrapped.read_parameter(name), q.detach(), rtol=1e-4,
                                   atol=1e-5)
    # Nothing is left acquired between steps; the scheduler saw 20 steps.
    for t, g in wrapped.strata_tensors().values():
        assert t.acquired == 0 and g.acquired == 0
    schedule = runtime.stats()["schedule"]
    assert schedule["steps"] == 20 and schedule["has_trace"]
    assert opt.stats()["steps"] == 20


def test_forward_without_autograd_releases_layer_by_layer(runtime):
    wrapped = st.offload(make_mlp(), runtime)
    x, _ = data(128)
    seen = []

    def probe(module, inputs, output):
        seen.append(sum(t.acquired for t, _ in wrapped.strata_tensors().values()))

    for m in wrapped.module:
        m.register_forward_hook(probe)
    with torch.no_grad():
        out = wrapped(x)
    assert out.shape == (128, 4)
    # Strata's post-hooks ran first: after each layer nothing is held.
    assert seen == [0] * 5
    wrapped.end_step()


def test_state_dict_round_trip(runtime):
    x, y = data(128)
    wrapped = st.offload(make_mlp(), runtime, home="nvme")
    opt = st.OffloadAdamW(wrapped, optimizer=st.ZeroAdamW(**HYPER))
    train(wrapped, opt, 5, x, y)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    after_save = train(wrapped, opt, 3, x, y)
    buffer.seek(0)
    opt.load_state_dict(torch.load(buffer))
    assert opt.optimizer.step_count == 5
    resumed = train(wrapped, opt, 3, x, y)
    assert resumed == after_save  # bitwise: masters, moments and steps restored


def test_state_dict_in_memory_round_trip(runtime, monkeypatch):
    """state_dict() reads the states from the optimizer (no checkpoint files), as CPU tensors;
    load_state_dict() restores masters, moments, step counts, the loss scaler and the
    hyper-parameters, bitwise, for states in the CPU tier."""
    x, y = data(128)
    wrapped = st.offload(make_mlp(), runtime, home="cpu")
    opt = st.OffloadAdamW(wrapped, optimizer=st.ZeroAdamW(**HYPER),
                          mp_policy=st.MixedPrecisionPolicy(loss_scale=64.0,
                                                            dynamic_loss_scale=True))
    train(wrapped, opt, 4, x, y)
    opt.lr = 1e-3

    def no_files(*args, **kwargs):
        raise AssertionError("state_dict went through files")
    monkeypatch.setattr(st.tempfile, "TemporaryDirectory", no_files)
    state = opt.state_dict()
    assert state["format"] == "strata.torch.OffloadAdamW/2"
    names = [name for name, _ in wrapped.module.named_parameters()]
    assert list(state["state"]) == names
    for name, p in wrapped.module.named_parameters():
        s = state["state"][name]
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert isinstance(s[key], torch.Tensor) and s[key].dtype == torch.float32
            assert s[key].device.type == "cpu"
            assert s[key].numel() == wrapped.read_parameter(name).numel()
        assert s["step"] == 4
    assert state["scaler"]["step"] == 4 and state["scaler"]["loss_scale"] > 0
    assert state["group"]["lr"] == pytest.approx(1e-3)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    after_save = train(wrapped, opt, 3, x, y)
    opt.lr = 7e-2  # load_state_dict brings the saved lr back
    buffer.seek(0)
    opt.load_state_dict(torch.load(buffer))
    assert opt.optimizer.step_count == 4 and opt.lr == pytest.approx(1e-3)
    assert opt.loss_scale == state["scaler"]["loss_scale"]
    resumed = train(wrapped, opt, 3, x, y)
    assert resumed == after_save  # bitwise


def test_state_dict_of_other_parameters_is_refused(runtime):
    wrapped = st.offload(make_mlp(), runtime, prefix="a.")
    opt = st.OffloadAdamW(wrapped)
    state = opt.state_dict()
    state["state"]["extra.weight"] = state["state"].pop("a.0.weight")  # the tensors' names
    with pytest.raises(ValueError, match=r"missing a\.0\.weight; not in this model extra\.weight"):
        opt.load_state_dict(state)
    with pytest.raises(ValueError, match="OffloadAdamW/2"):
        opt.load_state_dict({"format": "something else"})
    with pytest.raises(ValueError, match="has no scaler: it is damaged"):
        opt.load_state_dict({k: v for k, v in opt.state_dict().items() if k != "scaler"})


def test_state_dict_of_the_earlier_format_still_loads(runtime, tmp_path):
    """A state_dict saved before 2026-11-29 (format /1: checkpoint files as bytes)."""
    x, y = data(128)
    wrapped = st.offload(make_mlp(), runtime, home="nvme")
    opt = st.OffloadAdamW(wrapped, optimizer=st.ZeroAdamW(**HYPER))
    train(wrapped, opt, 3, x, y)
    opt.optimizer.save(str(tmp_path / "ckpt"))
    files = {}
    for root, _, names in os.walk(tmp_path / "ckpt"):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, tmp_path / "ckpt")] = f.read()
    old = {"format": "strata.torch.OffloadAdamW/1",
           "params": [n for n, _ in wrapped.module.named_parameters()], "files": files}
    after_save = train(wrapped, opt, 2, x, y)
    opt.load_state_dict(old)
    assert opt.optimizer.step_count == 3
    assert train(wrapped, opt, 2, x, y) == after_save


def test_offload_adamw_takes_zero_shards_policies_and_says_where_keywords_went(runtime):
    wrapped = st.offload(make_mlp(), runtime, home="cpu")
    for keyword, where in (("lr", r"optimizer=strata\.torch\.ZeroAdamW\(lr=\.\.\.\)"),
                           ("weight_decay", r"ZeroAdamW\(weight_decay=\.\.\.\)"),
                           ("overlap_step", r"ZeroAdamW\(overlap_step=\.\.\.\)"),
                           ("loss_scale", r"MixedPrecisionPolicy\(loss_scale=\.\.\.\)"),
                           ("state_home", r"OffloadPolicy\(state_home=\.\.\.\)"),
                           ("accumulation_steps", r"ReducePolicy\(accumulation_steps=")):
        with pytest.raises(TypeError, match=rf"OffloadAdamW\({keyword}=\.\.\.\): .*{where}"):
            st.OffloadAdamW(wrapped, **{keyword: 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'momentum'"):
        st.OffloadAdamW(wrapped, momentum=0.9)
    with pytest.raises(TypeError, match="ZeroAdamW"):
        st.OffloadAdamW(wrapped, optimizer=torch.optim.AdamW)
    with pytest.raises(ValueError, match="homed in 'cpu' by strata.torch.offload"):
        st.OffloadAdamW(wrapped, offload_policy=st.OffloadPolicy(param_home="nvme"))
    with pytest.raises(ValueError, match=r"offload\(\)'s dtype="):
        st.OffloadAdamW(wrapped, mp_policy=st.MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="reads only accumulation_steps"):
        st.OffloadAdamW(wrapped, reduce_policy=st.ReducePolicy(bucket_bytes="1MiB"))
    # The refusals left the module free: the policies' defaults, CPUOffloadPolicy accepted.
    opt = st.OffloadAdamW(wrapped, offload_policy=st.CPUOffloadPolicy())
    assert opt.optimizer.group(0)["weight_decay"] == pytest.approx(1e-2)  # AdamW's default


def test_lr_and_step_result(runtime):
    x, y = data(128)
    wrapped = st.offload(make_mlp(), runtime)
    opt = st.OffloadAdamW(wrapped, optimizer=st.ZeroAdamW(lr=1e-3))
    opt.lr = 5e-4
    assert opt.lr == pytest.approx(5e-4)
    loss = nn.functional.mse_loss(wrapped(x), y)
    loss.backward()
    result = opt.step()
    assert result["step"] == 1 and not result["skipped"]
    assert result["grad_norm"] > 0
    assert result["params_updated"] == 6


def test_gradient_accumulation_matches_torch(runtime):
    x, y = data(128)
    reference = make_mlp()
    wrapped = st.offload(copy.deepcopy(reference), runtime)
    opt = st.OffloadAdamW(wrapped, optimizer=st.ZeroAdamW(**HYPER))
    ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **HYPER)
    for _ in range(3):
        for model, o in ((wrapped, opt), (reference, ref_opt)):
            for half in (slice(0, 64), slice(64, 128)):
                nn.functional.mse_loss(model(x[half]), y[half]).backward()
            o.step()
            o.zero_grad()
    for (name, _), q in zip(wrapped.module.named_parameters(), reference.parameters()):
        torch.testing.assert_close(wrapped.read_parameter(name), q.detach(), rtol=1e-4,
                                   atol=1e-5)


def test_errors(runtime):
    with pytest.raises(TypeError):
        st.OffloadAdamW(make_mlp())
    with pytest.raises(ValueError, match="order"):
        st.offload(make_mlp(), runtime, order="sideways")
    wrapped = st.offload(make_mlp(), runtime, prefix="a.")
    st.OffloadAdamW(wrapped)
    with pytest.raises(ValueError, match="already has"):
        st.OffloadAdamW(wrapped)
    # The same names twice in one runtime: the store says so.
    with pytest.raises(strata.Error, match="a.0.weight"):
        st.offload(make_mlp(), runtime, prefix="a.")
