"""strata.torch activation offload (ZeRO-R): the tensors autograd saves in forward wait in strata's
CPU tier (or on NVMe) until backward, and come back into strata's GPU tier ahead of their use.

    offload = strata.torch.offload_activations(rt, home="cpu", window_bytes="512MiB")
    for x, y in data:
        with offload:                      # one step: forward under the hooks
            loss = loss_fn(model(x), y)
        loss.backward()                    # saved activations come back, prefetched
        opt.step()

or wrap the module: `model = strata.torch.OffloadActivations(model, rt, ...)` (its forward runs
under the hooks). How it works (docs/activations.md):

  - pack (forward, torch.autograd.graph.saved_tensors_hooks): a saved tensor of at least
    `min_bytes`, contiguous, that is not a parameter (nn.Parameter, a leaf that requires grad, or
    a view of one: model states stay where the trainer keeps them) is copied into a new activation
    of strata.ActivationStash in the pinned CPU tier. On CUDA the copy runs on a side stream that
    waits for the current one, non_blocking; the source is kept for torch's allocator until the
    copy is done (record_stream), and the host never synchronizes: the copy overlaps the next
    layers. Autograd keeps a small handle instead of the tensor.
  - unpack (backward): the stash loads the activation into the GPU tier (prefetched along the
    order the previous step's backward used, `prefetch_bytes` ahead) and torch gets a zero-copy
    DLPack view of it. When torch frees the view its DLPack deleter gives the load back, ordered
    after the work on the stream that used it; when autograd frees the handle (after the node
    ran) the stash frees the activation. The view keeps the handle alive, so the bytes are never
    freed under a live view.
  - Each `with` block (each wrapped forward) is one step of the stash: its save indices restart,
    and the previous step's backward order becomes the prefetch order.
  - torch.utils.checkpoint (reentrant, torch 1.13's default) saves only the checkpointed
    layers' inputs inside forward: those are what gets offloaded (DeepSpeed's cpu_checkpointing);
    the recomputation in backward runs outside the hooks and stays on the GPU.
  - Results are bitwise those without offload: the bytes are copied, never converted (bool
    tensors travel as their bytes, uint8, and come back viewed as bool: torch 1.13 cannot
    import DLPack's bool type).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn

import strata

__all__ = ["ActivationOffload", "OffloadActivations", "offload_activations"]

_OFFLOADABLE = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool}


def _is_model_state(t: torch.Tensor) -> bool:
    """Parameters and views of them: the trainer (or strata.torch.offload) keeps those."""
    if isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad):
        return True
    base = t._base
    return base is not None and (isinstance(base, nn.Parameter)
                                 or (base.is_leaf and base.requires_grad))


class _Saved:
    """What autograd keeps for an offloaded tensor: frees the activation when autograd lets go."""

    __slots__ = ("owner", "id", "shape", "dtype", "__weakref__")

    def __init__(self, owner, activation_id, shape, dtype):
        self.owner = owner
        self.id = activation_id
        self.shape = shape
        self.dtype = dtype

    def __del__(self):
        try:
            self.owner.stash.free(self.id)
        except Exception as error:  # noqa: BLE001 - a destructor has no caller to raise to
            warnings.warn(f"strata: freeing activation {self.id}: {error}", RuntimeWarning)


class ActivationOffload:
    """The saved-tensor hooks over a strata.ActivationStash; a context manager, one step per
    `with` block. See the module docstring and docs/activations.md."""

    def __init__(self, runtime: "strata.Runtime", home: str = "cpu",
                 window_bytes="256MiB", prefetch_bytes="64MiB", min_bytes="64KiB",
                 keep_tail: bool = True, record_trace: bool = False,
                 name: str = "activation"):
        self.min_bytes = strata.parse_size(min_bytes, "min_bytes")  # before any stash exists
        self.runtime = runtime
        self.stash = strata.ActivationStash(runtime, home=home, window_bytes=window_bytes,
                                            prefetch_bytes=prefetch_bytes, keep_tail=keep_tail,
                                            record_trace=record_trace, name=name)
        self.offloaded = 0        # tensors offloaded since creation
        self.offloaded_bytes = 0
        self.kept = 0             # saved tensors left to torch (small, parameters, strided)
        self._side = {}           # device -> torch.cuda.Stream for the copies out
        self._hooks = None

    # ---- the step ------------------------------------------------------------------------

    def __enter__(self):
        if self._hooks is not None:
            raise RuntimeError("strata.torch.offload_activations: already entered (one `with` "
                               "block per step)")
        self.stash.step_begin()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        hooks, self._hooks = self._hooks, None
        return hooks.__exit__(*exc)

    def stats(self) -> dict:
        """The stash's counters, plus what the hooks left to torch."""
        out = self.stash.stats()
        out["tensors_offloaded"] = self.offloaded
        out["tensors_kept_by_torch"] = self.kept
        return out

    # ---- the hooks -----------------------------------------------------------------------

    def _side_stream(self, device):
        stream = self._side.get(device)
        if stream is None:
            stream = torch.cuda.Stream(device)
            self._side[device] = stream
        return stream

    def _pack(self, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        if (nbytes < max(self.min_bytes, 1) or t.dtype not in _OFFLOADABLE
                or not t.is_contiguous() or _is_model_state(t)):
            self.kept += 1
            return t
        shape = tuple(t.shape)
        # bool travels as its bytes (uint8): torch before 2.x cannot import DLPack's kDLBool
        # ("Unsupported code 6"), and a causal mask is a bool tensor autograd saves.
        stored = torch.uint8 if t.dtype == torch.bool else t.dtype
        source = t.detach().view(torch.uint8) if t.dtype == torch.bool else t.detach()
        activation_id, acquisition = self.stash.allocate(shape, stored, "cpu")
        try:
            dst = torch.from_dlpack(acquisition)
            if t.is_cuda:
                side = self._side_stream(t.device)
                side.wait_stream(torch.cuda.current_stream(t.device))
                with torch.cuda.stream(side):
                    dst.copy_(source, non_blocking=True)
                t.record_stream(side)  # torch's allocator keeps it until the copy is done
                del dst
                acquisition.release(stream=side)  # offloads it, ordered after the copy
            else:
                dst.copy_(source)
                del dst
                acquisition.release()
        except BaseException:
            if not acquisition.released:
                acquisition.release()
            self.stash.free(activation_id)
            raise
        self.offloaded += 1
        self.offloaded_bytes += nbytes
        return _Saved(self, activation_id, shape, t.dtype)

    def _unpack(self, saved):
        if isinstance(saved, torch.Tensor):
            return saved
        boolean = saved.dtype == torch.bool
        acquisition = saved.owner.stash.load(saved.id, saved.shape,
                                             torch.uint8 if boolean else saved.dtype, owner=saved)
        # The view owns the acquisition (DLPack): torch freeing it gives the load back.
        view = torch.from_dlpack(acquisition)
        return view.view(torch.bool) if boolean else view


def offload_activations(runtime: "strata.Runtime", **options) -> ActivationOffload:
    """The saved-tensor hooks as a context manager: `with offload: loss = model(x)`. Options:
    home ("cpu" or "nvme"), window_bytes, prefetch_bytes, min_bytes (smaller saved tensors stay
    with torch), keep_tail, record_trace, name."""
    return ActivationOffload(runtime, **options)


class OffloadActivations(nn.Module):
    """`module` whose forward runs under activation offload (one step per forward)."""

    def __init__(self, module: nn.Module, runtime: "strata.Runtime", **options):
        super().__init__()
        self.module = module
        self.offload = ActivationOffload(runtime, **options)

    def forward(self, *args, **kwargs):
        with self.offload if torch.is_grad_enabled() else contextlib.nullcontext():
            return self.module(*args, **kwargs)
