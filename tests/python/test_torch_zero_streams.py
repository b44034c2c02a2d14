"""strata.torch.zero_shard's CUDA logic, run through the host backend (no GPU needed): the order
of work on streams, no host wait in forward and backward, activation checkpointing, bf16.

On a GPU the wrapper gives torch's current stream to every acquisition (the stream waits for
strata's gather, or for the bucket's previous reduce-scatter, behind an event) and to every
release (strata reuses the memory after an event there). On the host backend a strata.Stream
stands in for torch's stream (ZeroModule._torch_stream): the same calls then take the device-
side path, and a gate holding every stream shows that the host never waited for them.
tools/gpu-check runs the same module on a CUDA runtime (test_zero_shard_on_cuda).
"""

import copy
import threading

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import strata
import strata.torch as st
from conftest import solo_communicator
from strata._strata import testing
from mlp import data, make_mlp

HYPER = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.05)


def host_runtime():
    return strata.Runtime(backend="host", gpu_bytes="16MiB", cpu_bytes="16MiB", nvme_paths=None,
                          staging_bytes="4MiB")


def shard(module, comm, stage, **kw):
    # Small groups (several reduce-scatters, several gathers at stage 3) and a bucket for each,
    # so that no acquire_grad waits for a bucket (the one host wait of backward, by design).
    kw.setdefault("fetch_policy", st.FetchPolicy(persist_below_bytes=0))
    return st.zero_shard(module, comm, stage=stage,
                         reduce_policy=st.ReducePolicy(bucket_bytes="4KiB", gradient_buckets=8),
                         optimizer=st.ZeroAdamW(**HYPER), **kw)


def step(model, x, y):
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    model.step()
    return loss.detach().clone()


def finished(model, losses):
    """(losses, full state dict) of a run, its model closed."""
    state = model.full_state_dict()
    model.close()
    return losses, state


def assert_same_bits(run, reference):
    (losses, state), (want, want_state) = run, reference
    assert all(torch.equal(a, b) for a, b in zip(losses, want, strict=True))
    assert all(torch.equal(state[k], want_state[k]) for k in want_state)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_forward_and_backward_do_not_wait_on_the_host(stage):
    """With torch's stream a device stream, forward and backward issue everything (gathers,
    waits on their events, gradient adds, releases, reduce-scatters) while every stream of the
    device is held: no call waits on the host. Afterwards training goes on bitwise as a run
    without the held step."""
    x, y = data(32)
    rt, ref_rt = host_runtime(), host_runtime()
    model = shard(make_mlp(), solo_communicator(rt), stage)
    reference = shard(make_mlp(), solo_communicator(ref_rt), stage)
    losses = [step(model, x, y)]  # the host path; stage 3 records its order
    want = [step(reference, x, y)]

    torch_stream = rt.create_stream()  # what torch.cuda.current_stream() is on a GPU
    model._torch_stream = lambda: torch_stream
    gate = testing.hold(rt)
    watchdog = threading.Timer(30, gate.open)  # a call that waits fails the test, not hangs it
    watchdog.start()
    try:
        # torch computes on the host here, before the held gathers ran: values of no meaning,
        # dropped below. What counts is that every call returned.
        nn.functional.mse_loss(model(x), y).backward()
        returned_while_held = not gate.is_open
        gate.wait_until_held(1)  # a stream's worker has reached the gate (a count, no timing)
        held = gate.held
    finally:
        gate.open()
        watchdog.cancel()
    torch_stream.synchronize()
    del model._torch_stream
    assert returned_while_held, "forward/backward waited on the host for a held stream"
    assert held > 0  # the work was there, queued behind the gate
    model.zero_grad()  # the held step's gradients are dropped

    losses += [step(model, x, y) for _ in range(2)]
    want += [step(reference, x, y) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(losses, want, strict=True))
    full, full_ref = model.full_state_dict(), reference.full_state_dict()
    assert all(torch.equal(full[k], full_ref[k]) for k in full_ref)
    model.close()
    reference.close()


class Stepper:
    """Makes the device's streams slow and asynchronous without timing: every piece of work
    issued on any stream waits at a gate until this thread opens it, then the next gate
    closes. The trainer's thread runs ahead of strata's work; only the waits the wrapper
    orders keep the results right."""

    def __init__(self, rt):
        self.rt = rt
        self.lock = threading.Lock()
        self.stopped = False
        self.gate = None
        self.gates = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while True:
            with self.lock:
                if self.stopped:
                    return
                gate = self.gate = testing.hold(self.rt)
                self.gates += 1
            gate.wait_until_held(1)  # or opened by stop()
            gate.open()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.stopped = True
            if self.gate is not None:
                self.gate.open()
        self.thread.join()


@pytest.mark.parametrize("stage", [2, 3])
def test_slow_streams_give_the_same_bits(stage):
    """Training with every stream held piece by piece equals training without: torch (on the
    host here) reads gathered parameters and gradient buckets only after strata's work on
    them, and strata reuses memory only after torch's."""
    x, y = data(32)

    def run(slow):
        rt = host_runtime()
        model = shard(make_mlp(), solo_communicator(rt), stage,
                      fetch_policy=st.FetchPolicy(persist_below_bytes=0, reuse_window_bytes=0))
        if slow:
            with Stepper(rt) as stepper:
                losses = [step(model, x, y) for _ in range(3)]
            assert stepper.gates > 1
        else:
            losses = [step(model, x, y) for _ in range(3)]
        return finished(model, losses)

    assert_same_bits(run(True), run(False))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_backward_on_another_thread_gives_the_same_bits(stage):
    """On CUDA, torch runs backward on its autograd device thread, so the engine's calls come
    from two threads in turn: forward's from the caller's, backward's (acquires for backward,
    gradient adds, releases, reduce-scatters) from autograd's. Each backward here runs on a
    thread of its own (a new one every step, as no thread is special to the engine), and
    training equals the run on one thread, bitwise."""
    x, y = data(32)

    def run(backward_thread):
        model = shard(make_mlp(), solo_communicator(host_runtime()), stage,
                      fetch_policy=st.FetchPolicy(persist_below_bytes=0, reuse_window_bytes=0))
        losses = []
        for _ in range(3):
            loss = nn.functional.mse_loss(model(x), y)
            if backward_thread:
                failed = []

                def backward():
                    try:
                        loss.backward()
                    except BaseException as e:  # noqa: BLE001: re-raised on the test's thread
                        failed.append(e)

                worker = threading.Thread(target=backward)
                worker.start()
                worker.join(60)
                assert not worker.is_alive(), "backward on its own thread did not finish"
                if failed:
                    raise failed[0]
            else:
                loss.backward()
            model.step()
            losses.append(loss.detach().clone())
        return finished(model, losses)

    assert_same_bits(run(True), run(False))


class Block(nn.Module):
    def __init__(self, inner=None):
        super().__init__()
        self.up = nn.Linear(16, 48)
        self.down = nn.Linear(48, 16)
        self.inner = inner  # checkpoint `up` inside the unit ('reentrant' or 'non-reentrant')

    def forward(self, x):
        if self.inner is None:
            h = self.up(x)
        else:
            h = checkpoint(self.up, x, use_reentrant=self.inner == "reentrant")
        return x + self.down(torch.tanh(h))


class Stack(nn.Module):
    """Blocks, each activation-checkpointed whole when `checkpointed` is 'reentrant' (torch
    1.13's default) or 'non-reentrant'; 'inside-...': a layer inside each block (unit)."""

    def __init__(self, checkpointed=None):
        super().__init__()
        torch.manual_seed(99)
        inner = checkpointed[len("inside-"):] if checkpointed and "inside" in checkpointed else None
        self.blocks = nn.ModuleList(Block(inner) for _ in range(3))
        self.head = nn.Linear(16, 4)
        self.checkpointed = None if inner else checkpointed

    def forward(self, x):
        for b in self.blocks:
            if self.checkpointed is None:
                x = b(x)
            else:
                x = checkpoint(b, x, use_reentrant=self.checkpointed == "reentrant")
        return self.head(x)


@pytest.mark.parametrize("checkpointed,offload", [
    ("reentrant", False), ("non-reentrant", False), ("reentrant", True),
    ("inside-reentrant", False), ("inside-non-reentrant", False)])
def test_activation_checkpointing_at_stage_3(checkpointed, offload):
    """Checkpointed blocks re-run their forward in backward; their parameters are gathered
    again there and held until their gradients are in. Bitwise equal to the run without
    checkpointing (the same operations on the same values), alone and with the saved
    activations offloaded to strata."""
    x, y = data(32)
    x.requires_grad_(True)  # reentrant checkpointing needs an input that requires grad

    def run(checkpointed, offload):
        rt = host_runtime()
        model = st.zero_shard(Stack(checkpointed), solo_communicator(rt), stage=3,
                              units=(Block,),
                              reduce_policy=st.ReducePolicy(bucket_bytes="4KiB"),
                              fetch_policy=st.FetchPolicy(persist_below_bytes=0,
                                                          reuse_window_bytes=0),
                              optimizer=st.ZeroAdamW(**HYPER))
        stash = (st.offload_activations(rt, window_bytes="256KiB", prefetch_bytes="16KiB",
                                        min_bytes=0) if offload else None)
        losses = []
        for _ in range(3):
            if stash is not None:
                with stash:
                    loss = nn.functional.mse_loss(model(x), y)
            else:
                loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            model.step()
            losses.append(loss.detach().clone())
        if stash is not None:
            stash.stash.synchronize()
            assert stash.stats()["loads"] > 0
        return finished(model, losses)

    assert_same_bits(run(checkpointed, offload), run(None, False))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_parameters_and_gradients_track_fp32(stage):
    """bf16 parameters and gradients (fp32 masters and moments in the CPU tier) against the
    same training in fp32: every loss within 2e-2 relative (bf16 keeps 8 bits of mantissa:
    one rounding is up to 2^-9 = 2e-3 relative; forward, backward and the bf16 copy of the
    master add up to a few)."""
    x, y = data(32)

    def run(dtype):
        model = shard(make_mlp(), solo_communicator(host_runtime()), stage,
                      mp_policy=st.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype))
        losses = []
        for _ in range(4):
            loss = nn.functional.mse_loss(model(x.to(dtype)).float(), y)
            loss.backward()
            model.step()
            losses.append(loss.item())
        assert all(p.dtype == dtype for p in model.module.parameters())
        model.close()
        return losses

    got, want = run(torch.bfloat16), run(torch.float32)
    assert got != want  # bf16 did run
    assert all(abs(a - b) <= 2e-2 * abs(b) for a, b in zip(got, want, strict=True)), (got, want)
    assert got[-1] < got[0]


def test_compute_device_follows_the_runtime():
    """The placeholders (and the gradient accumulators' metadata), the buffers and a meta
    module's parameters go where the acquired memory is: the CPU for the host backend's GPU
    tier. A device= that disagrees is an error naming both."""
    comm = solo_communicator(host_runtime())
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model = st.zero_shard(copy.deepcopy(net), comm, stage=3)
    assert model.device == torch.device("cpu")
    assert all(p.device == model.device for p in model.module.parameters())
    model.close()
    with pytest.raises(ValueError, match=r"device='cuda': the module computes on cpu"):
        st.zero_shard(copy.deepcopy(net), comm, stage=3, device="cuda")
    with pytest.raises(ValueError, match=r"tier='nvme': use 'gpu'"):
        st.zero_shard(copy.deepcopy(net), comm, stage=3, tier="nvme")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA torch and a GPU "
                    "(tools/gpu-check runs it)")
@pytest.mark.parametrize("stage,dtype", [(1, torch.bfloat16), (3, torch.bfloat16),
                                         (3, torch.float16)])
def test_zero_shard_on_cuda(stage, dtype):
    """On a CUDA runtime: parameters acquired as CUDA tensors on the runtime's device, bf16 (or
    fp16 with dynamic loss scaling) training within 2e-2 of torch's fp32 AdamW on the GPU."""
    rt = strata.Runtime(backend="cuda", gpu_bytes="256MiB", cpu_bytes="256MiB", nvme_paths=None)
    comm = solo_communicator(rt)
    device = torch.device("cuda", rt.config["device"])
    x, y = (t.to(device) for t in data(32))
    mp = st.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                 loss_scale=1024.0 if dtype == torch.float16 else 1.0,
                                 dynamic_loss_scale=dtype == torch.float16)
    model = shard(make_mlp(), comm, stage, mp_policy=mp)
    reference = make_mlp().to(device)
    opt = torch.optim.AdamW(reference.parameters(), **HYPER)
    seen = []
    model.module[0].register_forward_pre_hook(
        lambda m, i: seen.append((m.weight.device, m.weight.dtype)))
    for _ in range(4):
        loss = nn.functional.mse_loss(model(x.to(dtype)).float(), y)
        (loss * model.loss_scale).backward()
        assert not model.step()["skipped"]
        want = nn.functional.mse_loss(reference(x), y)
        want.backward()
        opt.step()
        opt.zero_grad()
        assert abs(loss.item() - want.item()) <= 2e-2 * abs(want.item())
    assert seen[0] == (device, dtype)
    model.close()
