"""strata.torch.offload_activations(): saved activations through strata's tiers (host backend,
torch on the CPU). Losses and gradients must be bitwise those without offload; the GPU tier's
high-water mark must stay at the model states plus the window; NVMe copies are checksummed; a
full tier is a clear error."""

import contextlib
import copy
import gc
import os

import pytest

torch = pytest.importorskip("torch")
from torch.utils.checkpoint import checkpoint  # noqa: E402

import strata  # noqa: E402
import strata.torch as st  # noqa: E402

from conftest import solo_communicator  # noqa: E402

WIDTH = 96
BATCH = 128


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, blocks=4, checkpointed=False):
        super().__init__()
        self.embed = torch.nn.Linear(WIDTH, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.head = torch.nn.Linear(WIDTH, 1)
        self.checkpointed = checkpointed

    def forward(self, x):
        x = self.embed(x)  # so that the checkpointed blocks' inputs require grad
        for block in self.blocks:
            x = checkpoint(block, x) if self.checkpointed else block(x)
        return self.head(x)


def make_net(**kw):
    torch.manual_seed(1)
    return Net(**kw)


def batches(steps):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(BATCH, WIDTH, generator=g, requires_grad=False),
             torch.randn(BATCH, 1, generator=g)) for _ in range(steps)]


def train(model, data, offload=None, lr=0.05):
    """Plain SGD (torch's own parameters): the losses and every step's gradients."""
    losses, grads = [], []
    for x, y in data:
        model.zero_grad(set_to_none=True)
        loss = step_loss(model, x, y, offload)
        loss.backward()
        losses.append(loss.detach().clone())
        grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return losses, grads


def step_loss(model, x, y, offload=None):
    """The loss of one forward, under `offload` when given (one stash step)."""
    with offload if offload is not None else contextlib.nullcontext():
        return torch.nn.functional.mse_loss(model(x), y)


def assert_bitwise(a, b):
    (la, ga), (lb, gb) = a, b
    assert all(torch.equal(x, y) for x, y in zip(la, lb, strict=True)), (la, lb)
    for step_a, step_b in zip(ga, gb, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(step_a, step_b, strict=True))


def host_runtime(tmp_path, cpu_bytes="64MiB", gpu_bytes="16MiB", staging_bytes="8MiB"):
    nvme = tmp_path / "swap"
    nvme.mkdir(parents=True, exist_ok=True)
    return strata.Runtime(backend="host", gpu_bytes=gpu_bytes, cpu_bytes=cpu_bytes,
                          nvme_paths=[str(nvme)], nvme_bytes="128MiB",
                          staging_bytes=staging_bytes)


@pytest.mark.parametrize("home", ["cpu", "nvme"])
@pytest.mark.parametrize("checkpointed", [False, True])
def test_bitwise_identical_with_and_without_offload(tmp_path, home, checkpointed):
    data = batches(4)
    reference = train(make_net(checkpointed=checkpointed), data)
    rt = host_runtime(tmp_path)
    offload = st.offload_activations(rt, home=home, window_bytes="512KiB",
                                     prefetch_bytes="256KiB", min_bytes=0)
    got = train(make_net(checkpointed=checkpointed), data, offload)
    assert_bitwise(got, reference)
    offload.stash.synchronize()
    stats = offload.stats()
    assert stats["errors"] == 0 and stats["live"] == 0
    assert stats["loads"] == stats["saved"]
    assert stats["loads_prefetched"] > 0 and stats["has_order"]
    per_step = stats["tensors_offloaded"] // 4
    if checkpointed:
        # Only the checkpointed blocks' inputs (4) and what the embedding, the head and the
        # loss save (their inputs, the loss's two).
        assert per_step <= 4 + 4, stats
    else:
        assert per_step >= 6 * 4, stats


class Masked(torch.nn.Module):
    """Saves bool tensors for backward, as attention's causal mask: masked_fill keeps its mask,
    a comparison's result is bool."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = self.lin(x)
        return torch.nn.functional.mse_loss(h.masked_fill(h > 0.25, 0.0), torch.zeros_like(h))


def test_bool_activations_come_back_as_bool(tmp_path):
    """torch 1.13 cannot import DLPack's bool type (from_dlpack: "Unsupported code 6"): the
    hooks move bool tensors as their bytes and view them back as bool."""
    data = batches(3)

    def run(offload):
        torch.manual_seed(3)
        model = Masked()
        losses, grads = [], []
        for x, _ in data:
            model.zero_grad(set_to_none=True)
            with offload if offload is not None else contextlib.nullcontext():
                loss = model(x)
            loss.backward()
            losses.append(loss.detach().clone())
            grads.append([p.grad.clone() for p in model.parameters()])
        return losses, grads

    rt = host_runtime(tmp_path)
    offload = st.offload_activations(rt, window_bytes="512KiB", prefetch_bytes="128KiB",
                                     min_bytes=0)
    masks = []
    real_pack = offload._pack
    offload._pack = lambda t: (masks.append(t.dtype == torch.bool), real_pack(t))[1]
    assert_bitwise(run(offload), run(None))
    assert any(masks), "no bool tensor was saved: the test does not test what it says"
    offload.stash.synchronize()
    assert offload.stats()["errors"] == 0 and offload.stats()["live"] == 0


def test_gpu_tier_peak_is_model_states_plus_window(tmp_path):
    rt = host_runtime(tmp_path)
    window = 256 << 10
    offload = st.offload_activations(rt, window_bytes=window, prefetch_bytes=128 << 10,
                                     min_bytes=0)
    model = make_net(blocks=6)
    for x, y in batches(3):
        rt.reset_peak_usage()
        with offload:
            loss = torch.nn.functional.mse_loss(model(x), y)
        saved = offload.stash.stats()["live_bytes"]
        assert saved > 4 * window  # the window, not the model's size, bounds the peak
        loss.backward()
        offload.stash.synchronize()
        # torch's parameters are not in strata: the GPU tier holds activations only.
        assert rt.stats()["tiers"][0]["peak_used"] <= window
    assert offload.stats()["gpu_peak_bytes"] <= window


def test_composes_with_strata_parameter_offload(tmp_path):
    """The model's parameters live in strata too (strata.torch.offload): the GPU tier then holds
    the acquired parameters (model states) plus at most the window of activations."""
    data = batches(3)

    def run(with_offload):
        rt = host_runtime(tmp_path / ("on" if with_offload else "off"))
        model = st.offload(make_net(), rt, home="cpu")
        opt = st.OffloadAdamW(model, optimizer=st.ZeroAdamW(lr=1e-3))
        window = 192 << 10
        offload = (st.offload_activations(rt, window_bytes=window, prefetch_bytes=64 << 10,
                                          min_bytes=0) if with_offload else None)
        # The arena rounds each block up to 256 bytes.
        model_bytes = sum(-(-t.numel() * 4 // 256) * 256 for t in make_net().parameters())
        losses = []
        for x, y in data:
            rt.reset_peak_usage()
            loss = step_loss(model, x, y, offload)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
            if offload is not None:
                offload.stash.synchronize()
                # Parameters and gradient buffers in the GPU tier, plus the window.
                assert rt.stats()["tiers"][0]["peak_used"] <= 2 * model_bytes + window
        weights = {name: model.read_parameter(name) for name in model.strata_tensors()}
        return losses, weights

    (losses_on, weights_on), (losses_off, weights_off) = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(losses_on, losses_off, strict=True))
    assert all(torch.equal(weights_on[k], weights_off[k]) for k in weights_off)


def test_composes_with_zero_stage_3(tmp_path):
    data = batches(3)

    def run(with_offload):
        rt = host_runtime(tmp_path / ("on" if with_offload else "off"))
        comm = solo_communicator(rt)
        model = st.zero_shard(make_net(), comm, stage=3,
                              reduce_policy=st.ReducePolicy(bucket_bytes="16KiB"),
                              fetch_policy=st.FetchPolicy(persist_below_bytes=0),
                              optimizer=st.ZeroAdamW(lr=1e-3))
        offload = (st.offload_activations(rt, window_bytes="256KiB", prefetch_bytes="64KiB",
                                          min_bytes=0) if with_offload else None)
        losses = []
        for x, y in data:
            loss = step_loss(model, x, y, offload)
            loss.backward()
            model.step()
            losses.append(loss.detach().clone())
        if offload is not None:
            offload.stash.synchronize()
            assert offload.stats()["loads"] == offload.stats()["saved"] > 0
        return losses, model.full_state_dict()

    (losses_on, state_on), (losses_off, state_off) = run(True), run(False)
    assert all(torch.equal(a, b) for a, b in zip(losses_on, losses_off, strict=True))
    assert all(torch.equal(state_on[k], state_off[k]) for k in state_off)


def swap_file_descriptors(directory):
    """The descriptors of this process's unnamed swap files in `directory`."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + "/") and "(deleted)" in target:
            fds.append(int(fd))
    return fds


def test_nvme_activations_are_checksummed(tmp_path):
    rt = host_runtime(tmp_path)
    offload = st.offload_activations(rt, home="nvme", window_bytes="512KiB", prefetch_bytes=0,
                                     keep_tail=False, min_bytes=0)
    model = make_net()
    x, y = batches(1)[0]
    with offload:
        loss = torch.nn.functional.mse_loss(model(x), y)
    offload.stash.synchronize()  # every activation is on the drive now
    fds = swap_file_descriptors(tmp_path / "swap")
    assert len(fds) == 1
    with open(f"/proc/self/fd/{fds[0]}", "r+b", buffering=0) as f:
        for at in range(100, 4 << 20, 4096):  # a flipped byte in every 4 KiB of the extents
            f.seek(at)
            byte = f.read(1)
            if not byte:
                break
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x10]))
        os.fsync(f.fileno())
    # Autograd raises the unpack hook's strata.Error (DataLoss) with its message: as a
    # RuntimeError "Error: <message>" on torch 1.13, as itself (a RuntimeError) on torch 2.x.
    with pytest.raises(RuntimeError, match="activation stash: loading 'activation.*checksum "
                                           "mismatch"):
        loss.backward()


def test_full_cpu_tier_is_a_clear_error_and_the_runtime_goes_on(tmp_path):
    rt = host_runtime(tmp_path, cpu_bytes="2MiB", staging_bytes="1MiB")
    offload = st.offload_activations(rt, window_bytes="256KiB", prefetch_bytes="64KiB",
                                     min_bytes=0)
    model = make_net(blocks=8)
    x, y = batches(1)[0]
    # torch 1.13 calls the pack hook through pybind11 and turns its strata.ResourceExhaustedError
    # into a RuntimeError whose message is "ResourceExhaustedError: <the message>"; torch 2.x
    # calls it through the C API and lets the exception itself through (a RuntimeError too:
    # strata.Error derives from it). Either wording, the stash's message.
    with pytest.raises(RuntimeError, match="^(ResourceExhaustedError: )?activation stash: saving "
                                           "activation .*STRATA_CPU_BYTES.*home nvme"):
        with offload:
            torch.nn.functional.mse_loss(model(x), y)
    gc.collect()  # the failed forward's graph, and what it saved
    offload.stash.synchronize()
    assert offload.stash.stats()["live"] == 0
    # A smaller step fits and trains, bitwise as without offload.
    small = batches(1)[0][0][:8], batches(1)[0][1][:8]
    want = train(make_net(blocks=8), [small])
    got = train(make_net(blocks=8), [small], offload)
    assert_bitwise(got, want)


def test_parameters_and_small_tensors_stay_with_torch(tmp_path):
    rt = host_runtime(tmp_path)
    offload = st.offload_activations(rt, min_bytes="16KiB")
    model = make_net()
    x, y = batches(1)[0]
    with offload:
        loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    stats = offload.stats()
    # Linear weights (parameters), LayerNorm's per-row statistics (BATCH floats) stay.
    assert stats["tensors_kept_by_torch"] > 0 and stats["tensors_offloaded"] > 0
    assert stats["saved_bytes"] >= stats["tensors_offloaded"] * (16 << 10)


def test_bad_options_are_clear_errors(tmp_path):
    rt = host_runtime(tmp_path)
    with pytest.raises(strata.InvalidArgumentError, match="prefetch_bytes"):
        st.offload_activations(rt, window_bytes="64KiB", prefetch_bytes="128KiB")
    with pytest.raises(strata.InvalidArgumentError, match="window_bytes"):
        st.offload_activations(rt, window_bytes=0)
    with pytest.raises(strata.InvalidArgumentError):
        st.offload_activations(rt, home="gpu")
    with pytest.raises(ValueError, match="min_bytes"):
        st.offload_activations(rt, min_bytes="lots")
    no_nvme = strata.Runtime(backend="host", gpu_bytes="4MiB", cpu_bytes="8MiB")
    with pytest.raises(strata.FailedPreconditionError, match="STRATA_NVME_PATHS"):
        st.offload_activations(no_nvme, home="nvme")
    offload = st.offload_activations(rt)
    with offload:
        with pytest.raises(RuntimeError, match="already entered"):
            offload.__enter__()


def test_wrapper_module_offloads_each_forward(tmp_path):
    rt = host_runtime(tmp_path)
    data = batches(2)
    reference = train(make_net(), data)
    wrapped = st.OffloadActivations(make_net(), rt, window_bytes="512KiB",
                                    prefetch_bytes="128KiB", min_bytes=0)
    got = train(wrapped, data)
    assert_bitwise(got, reference)
    assert wrapped.offload.stats()["steps"] == 2
    with torch.no_grad():  # no autograd, no hooks: nothing saved
        wrapped(data[0][0])
    assert wrapped.offload.stats()["steps"] == 2


def test_copy_of_model_is_unaffected(tmp_path):
    """The hooks only see tensors saved inside the `with` block."""
    rt = host_runtime(tmp_path)
    offload = st.offload_activations(rt, min_bytes=0)
    model = make_net()
    other = copy.deepcopy(model)
    x, y = batches(1)[0]
    with offload:
        loss = torch.nn.functional.mse_loss(model(x), y)
    outside = torch.nn.functional.mse_loss(other(x), y)
    saved = offload.stats()["saved"]
    outside.backward()
    loss.backward()
    assert offload.stats()["saved"] == saved and offload.stats()["loads"] == saved
