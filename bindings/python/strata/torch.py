"""strata.torch: train a torch nn.Module whose parameters live in strata (one process), or
data-parallel over several ranks with ZeRO-DP stages 1-3 (zero_shard(), ZeroModule: in
zero_torch.py, imported here), with its saved activations offloaded (offload_activations(),
OffloadActivations: in activations_torch.py, imported here).

    import strata, strata.torch
    rt = strata.Runtime()
    model = strata.torch.offload(MyModel(), rt, home="cpu")     # or home="nvme"
    opt = strata.torch.OffloadAdamW(
        model, optimizer=strata.torch.ZeroAdamW(lr=1e-3, weight_decay=0.01))
    for x, y in data:
        loss = loss_fn(model(x), y)
        loss.backward()          # gradients go to strata as they are produced
        opt.step()               # ZeRO-Offload: Adam on the CPU, parameters written back
        opt.zero_grad()

How it works (docs/python.md has the details):
  - offload() copies each parameter into a strata tensor (home tier cpu or nvme) with a gradient
    tensor beside it, and empties the torch parameter (a 0-element placeholder).
  - A forward pre-hook on every module with parameters acquires them (tier "gpu": device memory
    with the CUDA backend, host memory with the host backend) and points each parameter's .data
    at the acquired memory through DLPack, zero copy. Without autograd (torch.no_grad, eval
    loops) the forward post-hook releases them at once, layer by layer. With autograd they stay
    acquired until backward has used them: autograd saves views of the weights (e.g. the
    transposed weight of nn.Linear), which must not move while the graph lives. Each layer's
    parameters are released as soon as backward is past the layer (when its input requires
    grad), the rest when backward ends.
  - A hook on each parameter copies its gradient into the strata gradient tensor and calls the
    optimizer's grad_ready(), so the gradient's trip to the CPU overlaps the rest of backward.
    p.grad is cleared when backward ends: the gradient lives in strata (use max_grad_norm for
    clipping rather than torch.nn.utils.clip_grad_norm_).
  - Streams: torch.from_dlpack hands strata torch's current stream, which waits for the memory on
    the device; releases name torch's current stream, where strata records the end of torch's
    work. The host never waits for torch's kernels or strata's copies in the hooks (with the
    host backend torch runs on the CPU, and a CPU consumer waits for strata's copy at
    from_dlpack).
  - OffloadAdamW.step() runs strata's ZeRO-Offload step (fp32 master weights and moments in the
    CPU tier or on NVMe) and closes the scheduler's step: the first step records the access
    order and later steps prefetch along it; offload(order="module") gives the order up front.
"""

from __future__ import annotations

import os
import tempfile

import torch
from torch import nn

import strata

__all__ = ["Offloaded", "OffloadAdamW", "offload", "ZeroModule", "zero_shard", "ActivationOffload",
           "OffloadActivations", "offload_activations", "MixedPrecisionPolicy", "PlacementPolicy",
           "OffloadPolicy", "CPUOffloadPolicy", "FetchPolicy", "ReducePolicy", "ZeroAdamW"]

_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
}


def _dtype_name(dtype) -> str:
    if dtype not in _DTYPES:
        raise ValueError(f"{dtype} is not a parameter dtype strata.torch supports: use "
                         "torch.float32, torch.float16 or torch.bfloat16")
    return _DTYPES[dtype]


def _stream_of(tensor):
    """The stream torch's work on `tensor` runs on, as release() takes it: strata records the
    end of that work there and reuses the memory only after it; the host does not wait. None
    for CPU tensors (the host backend): their work is done when the Python call returns."""
    if tensor.is_cuda:
        return torch.cuda.current_stream(tensor.device)
    return None


class _Param:
    """One torch parameter and its strata tensors."""

    __slots__ = ("name", "param", "tensor", "grad_tensor", "pid", "acquisitions",
                 "initial_master", "placeholder")

    def __init__(self, name, param, tensor, grad_tensor, initial_master, placeholder):
        self.name = name
        self.param = param
        self.tensor = tensor
        self.grad_tensor = grad_tensor
        self.pid = None  # set when an optimizer registers it
        self.acquisitions = []
        self.initial_master = initial_master  # fp32 numpy copy until an optimizer takes it
        self.placeholder = placeholder


class _Leaf:
    """A module with parameters of its own, and the acquisitions its last forward holds."""

    __slots__ = ("module", "params", "held", "pending_inputs")

    def __init__(self, module, params):
        self.module = module
        self.params = params
        self.held = 0  # forward calls whose acquisitions are not yet released
        self.pending_inputs = 0


class _ReleaseAfterBackward(torch.autograd.Function):
    """Identity on a layer's input; its backward runs once backward is past the layer."""

    @staticmethod
    def forward(ctx, owner, leaf, tensor):  # noqa: D102
        ctx.owner = owner
        ctx.leaf = leaf
        return tensor.detach()

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        leaf = ctx.leaf
        leaf.pending_inputs -= 1
        if leaf.pending_inputs <= 0 and leaf.held > 0:
            ctx.owner._release_leaf(leaf)
        return None, None, grad


class Offloaded(nn.Module):
    """An nn.Module whose parameters live in strata (see the module docstring)."""

    def __init__(self, module: nn.Module, runtime: "strata.Runtime", home: str = "cpu",
                 dtype=torch.float32, tier: str = "gpu", order: str = "record",
                 prefix: str = ""):
        super().__init__()
        if order not in ("record", "module"):
            raise ValueError(f"order={order!r}: use 'record' (the first step records the "
                             "access order) or 'module' (the module order, given up front)")
        self.module = module
        self.runtime = runtime
        self.home = home
        self.tier = tier
        self.dtype = dtype
        self._params: list[_Param] = []
        self._leaves: list[_Leaf] = []
        self._optimizer = None
        self._in_step = False
        self._backward_queued = False
        self._hooks = []
        dtype_name = _dtype_name(dtype)
        by_id = {}
        for module_name, sub in module.named_modules():
            own = list(sub.named_parameters(recurse=False))
            if not own:
                continue
            leaf_params = []
            for param_name, p in own:
                if id(p) in by_id:  # shared with an earlier module
                    leaf_params.append(by_id[id(p)])
                    continue
                name = prefix + (f"{module_name}.{param_name}" if module_name else param_name)
                shape = tuple(p.shape)
                t = runtime.create(name, shape, dtype_name, home=home)
                g = runtime.create(name + ".grad", shape, dtype_name, home=home)
                with t.acquire("cpu", "w") as view:
                    torch.from_dlpack(view).copy_(p.detach().reshape(shape))
                master = p.detach().to("cpu", torch.float32).reshape(-1).numpy().copy()
                placeholder = torch.empty(0, dtype=dtype, device=p.device)
                p.data = placeholder
                prm = _Param(name, p, t, g, master, placeholder)
                by_id[id(p)] = prm
                self._params.append(prm)
                leaf_params.append(prm)
                if p.requires_grad:
                    self._hooks.append(p.register_hook(
                        lambda grad, prm=prm: self._grad_hook(prm, grad)))
            leaf = _Leaf(sub, leaf_params)
            self._leaves.append(leaf)
            self._hooks.append(sub.register_forward_pre_hook(
                lambda mod, inputs, leaf=leaf: self._pre_forward(leaf, inputs)))
            self._hooks.append(sub.register_forward_hook(
                lambda mod, inputs, output, leaf=leaf: self._post_forward(leaf)))
        if order == "module":
            self.set_module_order()

    # ---- the training step -----------------------------------------------------------------

    def forward(self, *args, **kwargs):
        self.begin_step()
        return self.module(*args, **kwargs)

    def begin_step(self) -> None:
        """Opens the scheduler's step (forward does it; OffloadAdamW.step() closes it)."""
        if not self._in_step:
            self.runtime.step_begin()
            self._in_step = True

    def end_step(self) -> None:
        """Releases what is still acquired and closes the scheduler's step (for loops without
        an optimizer step, e.g. evaluation)."""
        self.release_all()
        if self._in_step:
            self.runtime.step_end()
            self._in_step = False

    def set_module_order(self) -> None:
        """Gives the scheduler the step's order up front: parameters in module order for
        forward, then gradients in reverse order for backward."""
        order = [(prm.tensor, self.tier) for leaf in self._leaves for prm in leaf.params]
        order += [(prm.grad_tensor, self.tier) for prm in reversed(self._params)]
        self.runtime.set_access_order(order)

    # ---- hooks -----------------------------------------------------------------------------

    def _acquire_param(self, prm: _Param) -> None:
        acquisition = prm.tensor.acquire(self.tier, "r")
        if not prm.acquisitions:
            prm.param.data = torch.from_dlpack(acquisition)
        prm.acquisitions.append(acquisition)

    def _release_param(self, prm: _Param) -> None:
        acquisition = prm.acquisitions.pop()
        stream = _stream_of(prm.param.data)
        if not prm.acquisitions:
            prm.param.data = prm.placeholder  # drops the DLPack view before the release
        acquisition.release(stream=stream)

    def _pre_forward(self, leaf: _Leaf, inputs):
        for prm in leaf.params:
            self._acquire_param(prm)
        leaf.held += 1
        if not torch.is_grad_enabled():
            return None
        # Release the layer once backward has produced the gradients of its inputs.
        wrapped = []
        count = 0
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x = _ReleaseAfterBackward.apply(self, leaf, x)
                count += 1
            wrapped.append(x)
        if count == 0:
            return None
        leaf.pending_inputs += count
        return tuple(wrapped)

    def _post_forward(self, leaf: _Leaf):
        if not torch.is_grad_enabled() or not any(p.param.requires_grad for p in leaf.params):
            self._release_leaf(leaf)
        return None

    def _release_leaf(self, leaf: _Leaf) -> None:
        if leaf.held == 0:
            return
        leaf.held -= 1
        for prm in reversed(leaf.params):
            self._release_param(prm)

    def release_all(self) -> None:
        """Releases every parameter still acquired by forward passes."""
        for leaf in self._leaves:
            while leaf.held > 0:
                self._release_leaf(leaf)
            leaf.pending_inputs = 0

    def _grad_hook(self, prm: _Param, grad):
        if not self._backward_queued:
            self._backward_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            if self._optimizer is not None:
                self._optimizer._begin_backward()
        acquisition = prm.grad_tensor.acquire(self.tier, "w")
        stream = None
        try:
            dst = torch.from_dlpack(acquisition)  # torch's stream waits for the memory
            stream = _stream_of(dst)
            dst.copy_(grad.detach().reshape(dst.shape))
            del dst
        finally:
            acquisition.release(stream=stream)  # grad_ready's copy waits for the copy_ above
        if self._optimizer is not None:
            self._optimizer._grad_ready(prm)
        return None

    def _backward_done(self) -> None:
        self._backward_queued = False
        self.release_all()
        for prm in self._params:
            prm.param.grad = None  # the gradient lives in strata

    # ---- inspection ------------------------------------------------------------------------

    def strata_tensors(self):
        """{parameter name: (parameter tensor, gradient tensor)}"""
        return {prm.name: (prm.tensor, prm.grad_tensor) for prm in self._params}

    def read_parameter(self, name: str):
        """A CPU torch copy of a parameter's current value in strata."""
        for prm in self._params:
            if prm.name == name:
                with prm.tensor.acquire("cpu", "r") as view:
                    return torch.from_dlpack(view).clone()
        raise KeyError(f"no parameter named {name!r}")

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


def offload(module: nn.Module, runtime: "strata.Runtime", home: str = "cpu",
            dtype=torch.float32, tier: str = "gpu", order: str = "record",
            prefix: str = "") -> Offloaded:
    """Moves `module`'s parameters into strata tensors homed in `home` (cpu or nvme) and
    returns the wrapped module. `tier`: where forward and backward use them (gpu; with the
    host backend that is host memory). `order`: "record" (the first step records the access
    order) or "module" (module order, given up front). `prefix` names the tensors (several
    models in one Runtime)."""
    return Offloaded(module, runtime, home=home, dtype=dtype, tier=tier, order=order,
                     prefix=prefix)


# OffloadAdamW's keywords before it took zero_shard's policy objects: where each one went.
_OFFLOAD_ADAMW_MOVED = {
    **{k: f"optimizer=strata.torch.ZeroAdamW({k}=...)"
       for k in ("lr", "betas", "eps", "weight_decay", "max_grad_norm", "chunk_elements",
                 "overlap_step", "overlap_max_host_bytes")},
    "loss_scale": "mp_policy=strata.torch.MixedPrecisionPolicy(loss_scale=...)",
    "dynamic_loss_scale": "mp_policy=strata.torch.MixedPrecisionPolicy(dynamic_loss_scale=...)",
    "state_home": "offload_policy=strata.torch.OffloadPolicy(state_home=...) (or "
                  "CPUOffloadPolicy())",
    "accumulation_steps": "reduce_policy=strata.torch.ReducePolicy(accumulation_steps=...)",
}


class OffloadAdamW:
    """AdamW (torch.optim.AdamW semantics) run by strata's ZeRO-Offload optimizer, configured
    by zero_shard's policy objects (keyword-only; None: that policy's defaults):

      optimizer       ZeroAdamW (lr, betas, eps, weight_decay, decoupled, max_grad_norm,
                      chunk_elements, overlap_step, overlap_max_host_bytes); None is
                      ZeroAdamW(weight_decay=1e-2), torch.optim.AdamW's default
      mp_policy       MixedPrecisionPolicy: loss_scale, dynamic_loss_scale, skip_on_overflow
                      (the dtypes are offload()'s dtype=, so param_dtype and reduce_dtype must
                      stay float32 here)
      offload_policy  OffloadPolicy(state_home='cpu'|'nvme') or CPUOffloadPolicy(): where the
                      fp32 masters and moments live (the parameters' home is offload()'s home=)
      reduce_policy   ReducePolicy(accumulation_steps=N): the backward passes per step()

    step() returns strata's step result as a dict (skipped, grad_norm, clip_coef, step,
    loss_scale, early_elements, rolled_back, ...). state_dict() holds every parameter's fp32
    master and moments (CPU tensors), step counts, the loss scaler and the hyper-parameters,
    read from the optimizer in memory, so it pickles with torch.save; load_state_dict() writes
    them back (also into the model's parameters, rounded), bitwise.

    ZeroAdamW(overlap_step=True): the overlapped step (strata.OverlapOptions). Each
    parameter's Adam runs on the CPU as soon as its gradient of the step is final, while
    backward goes on; step() then validates it (clipping, overflow) and keeps it, or rolls it
    back and redoes it. The result is bitwise the plain step's; what step() still costs after
    backward is stats()["last_step_ns"]. overlap_max_host_bytes caps the CPU-tier bytes its
    backups take (0: the tier's capacity). With accumulation_steps > 1 the gradients of the
    earlier backward passes are announced as partial, so that Adam starts only in the last
    (another count is still right, only slower: the early work is redone). For a varying count,
    set_final_micro_step(False) before each backward that is not the step's last.
    """

    def __init__(self, module: Offloaded, *, optimizer=None, mp_policy=None,
                 offload_policy=None, reduce_policy=None, **moved):
        from .zero_policy import (MixedPrecisionPolicy, OffloadPolicy, PlacementPolicy,
                                  ReducePolicy, ZeroAdamW, _expect)
        if moved:
            name = next(iter(moved))
            if name in _OFFLOAD_ADAMW_MOVED:
                raise TypeError(f"OffloadAdamW({name}=...): the options are grouped in "
                                "zero_shard's policy objects now; use "
                                f"{_OFFLOAD_ADAMW_MOVED[name]}")
            raise TypeError(f"OffloadAdamW() got an unexpected keyword argument {name!r} (use "
                            "optimizer, mp_policy, offload_policy, reduce_policy)")
        if not isinstance(module, Offloaded):
            raise TypeError("OffloadAdamW takes the module returned by strata.torch.offload()")
        if module._optimizer is not None:
            raise ValueError("this module already has an OffloadAdamW")
        adam = (ZeroAdamW(weight_decay=1e-2) if optimizer is None
                else _expect(optimizer, ZeroAdamW, "optimizer"))
        mp = _expect(mp_policy, MixedPrecisionPolicy, "mp_policy")
        if mp.param_dtype != torch.float32 or mp.reduce_dtype != torch.float32:
            raise ValueError(f"mp_policy={mp!r}: OffloadAdamW's dtypes are strata.torch."
                             "offload()'s dtype= (the parameters and their gradients); leave "
                             "param_dtype and reduce_dtype at float32 here")
        placement = (OffloadPolicy(state_home="cpu") if offload_policy is None else
                     _expect(offload_policy, PlacementPolicy, "offload_policy",
                             "strata.torch.OffloadPolicy(state_home=...) or CPUOffloadPolicy()"))
        if placement.param_home not in ("gpu", module.home):
            raise ValueError(f"offload_policy={placement!r}: this module's parameters are homed "
                             f"in {module.home!r} by strata.torch.offload(home=...); the policy "
                             f"says param_home={placement.param_home!r}")
        reduce = _expect(reduce_policy, ReducePolicy, "reduce_policy")
        if reduce != ReducePolicy(accumulation_steps=reduce.accumulation_steps):
            raise ValueError(f"reduce_policy={reduce!r}: OffloadAdamW reads only "
                             "accumulation_steps (bucket_bytes, gradient_buckets and alignment "
                             "are zero_shard's)")
        self.module = module
        self.accumulation_steps = reduce.accumulation_steps
        self._backwards = 0  # backward passes since the last step()
        overlap = strata.OverlapOptions(enabled=adam.overlap_step,
                                        max_host_bytes=adam.overlap_max_host_bytes)
        self._opt = strata.OffloadOptimizer(
            module.runtime, state_home=placement.state_home, lr=adam.lr, betas=adam.betas,
            eps=adam.eps, weight_decay=adam.weight_decay, decoupled=adam.decoupled,
            max_grad_norm=adam.max_grad_norm, loss_scale=mp.loss_scale,
            dynamic_loss_scale=mp.dynamic_loss_scale, skip_on_overflow=mp.skip_on_overflow,
            chunk_elements=adam.chunk_elements, overlap=overlap)
        for prm in module._params:
            prm.pid = self._opt.add_param(prm.name, prm.tensor, prm.grad_tensor,
                                          initial_master=prm.initial_master)
            prm.initial_master = None
        module._optimizer = self

    @property
    def optimizer(self) -> "strata.OffloadOptimizer":
        return self._opt

    @property
    def lr(self) -> float:
        return self._opt.group(0)["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self._opt.set_lr(0, value)

    @property
    def loss_scale(self) -> float:
        return self._opt.loss_scale

    def _begin_backward(self) -> None:
        self._backwards += 1

    def _grad_ready(self, prm: _Param) -> None:
        # With accumulation, the earlier backward passes' gradients are partial ('more'); the
        # last's (and any beyond) complete it. Without, set_final_micro_step's setting.
        completion = None
        if self.accumulation_steps > 1:
            completion = "more" if self._backwards < self.accumulation_steps else "final"
        self._opt.grad_ready(prm.pid, completion=completion)

    def set_final_micro_step(self, final: bool) -> None:
        """Overlap with accumulation_steps=1: whether the coming backward passes complete the
        step's gradients (True, set again by every step()) or are micro-steps that later ones
        add to (False)."""
        self._opt.set_final_micro_step(final)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.module.release_all()
        self._backwards = 0
        result = self._opt.step()
        self.module.end_step()
        if loss is not None:
            result["loss"] = loss
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._opt.zero_grad()
        self._backwards = 0
        for prm in self.module._params:
            prm.param.grad = None

    def stats(self) -> dict:
        return self._opt.stats()

    def state_dict(self) -> dict:
        """Every parameter's fp32 master and Adam moments (CPU tensors) and step count, the
        step counter and loss scaler, the hyper-parameters: read from the optimizer in memory
        (no files)."""
        self.module.release_all()
        state = {}
        for prm in self.module._params:
            master, exp_avg, exp_avg_sq = self._opt.read_state(prm.pid)
            state[prm.name] = {"master": _cpu_tensor(master), "exp_avg": _cpu_tensor(exp_avg),
                               "exp_avg_sq": _cpu_tensor(exp_avg_sq),
                               "step": self._opt.param_step_count(prm.pid)}
        return {"format": _STATE_FORMAT, "state": state, "scaler": self._opt.scaler_state(),
                "group": self._opt.group(0)}

    def load_state_dict(self, state: dict) -> None:
        """Loads a state_dict() of an OffloadAdamW over the same parameters (names and element
        counts); the model's parameters become the saved masters, rounded: training resumes
        bit for bit. A state_dict of the earlier format (checkpoint files) loads too."""
        kind = state.get("format") if isinstance(state, dict) else None
        self.module.release_all()
        if kind == _FILES_FORMAT:
            self._load_files(state)
            return
        if kind != _STATE_FORMAT:
            raise ValueError("not a strata.torch.OffloadAdamW state_dict (its 'format' is "
                             f"{kind!r}, want {_STATE_FORMAT!r})")
        missing_keys = [k for k in ("state", "scaler", "group") if k not in state]
        if missing_keys:
            raise ValueError(f"the OffloadAdamW state_dict has no {', '.join(missing_keys)}: it "
                             "is damaged; load one written by state_dict()")
        saved, names = state["state"], [prm.name for prm in self.module._params]
        if sorted(saved) != sorted(names):
            missing = sorted(set(names) - set(saved))
            extra = sorted(set(saved) - set(names))
            raise ValueError("the state_dict is of other parameters: "
                             + "; ".join(part for part in (
                                 f"missing {', '.join(missing)}" if missing else "",
                                 f"not in this model {', '.join(extra)}" if extra else "")
                                 if part))
        for prm in self.module._params:
            s = saved[prm.name]
            self._opt.write_state(prm.pid, s["master"].contiguous(), s["exp_avg"].contiguous(),
                                  s["exp_avg_sq"].contiguous(), int(s["step"]))
        scaler = state["scaler"]
        self._opt.set_scaler_state(int(scaler["step"]), float(scaler["loss_scale"]),
                                   int(scaler["good_steps"]))
        self._opt.set_group(0, **state["group"])

    def _load_files(self, state: dict) -> None:
        with tempfile.TemporaryDirectory(prefix="strata-state-") as directory:
            for relative, data in state["files"].items():
                path = os.path.join(directory, relative)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            self._opt.load(directory)


_STATE_FORMAT = "strata.torch.OffloadAdamW/2"
_FILES_FORMAT = "strata.torch.OffloadAdamW/1"  # checkpoint files as bytes (before 2026-11-29)


def _cpu_tensor(values) -> torch.Tensor:
    """read_state's float32 array (numpy, or a memoryview without numpy) as a CPU tensor."""
    try:
        return torch.from_numpy(values)
    except TypeError:
        return torch.frombuffer(bytearray(values), dtype=torch.float32)


# The data-parallel path (ZeRO-DP stages 1-3 over strata's Communicator): its own file.
from .zero_policy import (CPUOffloadPolicy, FetchPolicy, MixedPrecisionPolicy,  # noqa: E402
                          OffloadPolicy, PlacementPolicy, ReducePolicy, ZeroAdamW)
from .zero_torch import ZeroModule, zero_shard  # noqa: E402

# Activation offload (ZeRO-R: saved tensors through the tiers): its own file.
from .activations_torch import (  # noqa: E402
    ActivationOffload,
    OffloadActivations,
    offload_activations,
)
