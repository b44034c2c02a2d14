"""strata.torch's data-parallel path: an nn.Module trained with ZeRO-DP stages 1, 2 or 3 over
strata's Communicator (imported by strata.torch; docs/python.md has the details).

    # torchrun --nproc-per-node=4 train.py   (or srun, strata-run: docs/python.md, "Launching")
    import strata, strata.torch as st
    rt = strata.Runtime()
    comm = strata.Communicator.from_environment(rt)
    model = st.zero_shard(MyModel(), comm, stage=3,
                          offload_policy=st.PlacementPolicy(param_home="cpu", state_home="cpu"),
                          optimizer=st.ZeroAdamW(lr=1e-3, weight_decay=0.01))
    for x, y in my_slice_of_each_global_batch:
        loss_fn(model(x), y).backward()   # gradients reduce-scatter as backward produces them
        result = model.step()             # strata's Adam on this rank's slice; the same on all
    model.save_sharded("/shared/ckpt")   # loads at any world size; full_state_dict() on rank 0

How it works:
  - Units (as FSDP's fully_shard): by default every module with parameters of its own;
    `units=` names module classes (or a predicate) whose whole subtree is one unit. Every
    parameter is registered once with one strata.ZeroEngine (stage 1, 2 or 3), in unit order,
    and the torch parameter becomes a 0-element placeholder.
  - Forward: a unit's forward pre-hook acquires its parameters from the engine (stage 3
    gathers them from the ranks' shards, prefetching along the recorded order) and points
    `param.data` at them through DLPack, zero copy; the forward post-hook releases them.
    Autograd does not keep the released memory: while the wrapper's forward runs, saved-tensor
    hooks replace a parameter (or a view of one, as nn.Linear's transposed weight) by a
    reference that backward resolves against the parameter's memory of the moment.
  - Backward: a hook on each unit's outputs acquires the unit's parameters again before its
    backward runs (a backward pre-hook that torch 1.13 lacks); as soon as a parameter's gradient
    is accumulated, a post-accumulate hook adds it into the engine's gradient buffer
    (acquire_grad; stage 2-3: a bucket, reduce-scattered when its group is complete, during
    the rest of backward), clears `param.grad` and releases the parameter. When backward ends,
    parameters backward did not reach get a zero gradient (the engine takes every parameter's
    gradient every micro-step) and whatever is still acquired is released.
  - A parameter used by more than one module call in a forward (a block applied twice, weights
    tied across units; counted by a forward pre-hook on every module with parameters of its
    own) may get its gradient more than once in one backward: autograd sums the uses of one
    graph, but activation checkpointing runs a segment's backward on its own (reentrant) and
    each arrival is then a part. Such a parameter keeps its gradient in `param.grad`, where
    the next arrival accumulates, and is pushed once when backward ends; the others are pushed
    as they arrive.
  - On a CUDA runtime the module computes on the runtime's GPU (model.device). Every
    acquisition is made for torch's current stream (the engine orders it after its gather,
    copy or reduce-scatter on the device) and every release records an event there (memory is
    reused after it): forward and backward never wait on the host. Activation checkpointing:
    a unit re-run in backward holds its parameters until their gradients are in.
    docs/zero.md, "On a GPU", has the order of a step on the streams.
  - Every rank makes the same engine calls in the same order (the model and its graph are the
    same), which is what the engine's collectives need. Collectives go through strata's
    Communicator only (torch.distributed's collectives are not used; its store may be, where the
    Communicator joined torchrun's or the script's own torch.distributed job).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import strata

from .zero_policy import (FetchPolicy, MixedPrecisionPolicy, PlacementPolicy, ReducePolicy,
                          ZeroAdamW, _moved_message, to_options)
from .zero_meta import _initial_values, _replace_meta_parameters
from .zero_state_torch import _ZeroModuleState
from .zero_units import _unit_owners

__all__ = ["ZeroModule", "zero_shard"]


def _tensors_in(value):
    """The tensors in a module's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)


class _Param:
    """One torch parameter registered with the engine."""

    __slots__ = ("name", "param", "pid", "dtype", "acquisitions", "backward_held", "grad_seen",
                 "placeholder", "accumulator", "uses", "grad_held")

    def __init__(self, name, param, pid, dtype, placeholder):
        self.name = name
        self.param = param
        self.pid = pid
        self.dtype = dtype  # the module's original dtype (full state dicts give it back)
        self.acquisitions = []  # param.data is the acquired memory while this is not empty
        self.backward_held = False  # acquired for backward, released when its gradient is in
        self.grad_seen = False  # this micro-step's gradient went to the engine
        self.placeholder = placeholder
        self.accumulator = None  # the AccumulateGrad node our hook is on
        self.uses = 0  # module calls that used it in the forward(s) since the last backward
        self.grad_held = False  # this backward's gradient waits in param.grad (uses > 1)


class _Unit:
    __slots__ = ("name", "module", "params")

    def __init__(self, name, module, params):
        self.name = name
        self.module = module
        self.params = params  # every parameter its forward uses directly (shared ones too)


class _Saved:
    """What autograd keeps instead of a parameter, or of a view of one, while it is released."""

    __slots__ = ("prm", "view")

    def __init__(self, prm, view):
        self.prm = prm
        self.view = view  # None: the parameter itself; else (size, stride, storage offset)


class ZeroModule(_ZeroModuleState, nn.Module):
    """An nn.Module trained data-parallel with a strata.ZeroEngine (see the module docstring).
    zero_shard() makes one; its keyword arguments are ZeroModule's."""

    def __init__(self, module: nn.Module, comm: "strata.Communicator", *, stage: int = 3,
                 units=None, mp_policy: MixedPrecisionPolicy | None = None,
                 offload_policy: PlacementPolicy | None = None,
                 fetch_policy: FetchPolicy | None = None,
                 reduce_policy: ReducePolicy | None = None, optimizer: ZeroAdamW | None = None,
                 tier: str = "gpu", sync_module_states: bool = True, param_init=None,
                 device=None, **moved):
        super().__init__()
        if moved:
            raise TypeError(_moved_message(moved))
        if comm.runtime is None:
            raise ValueError("the Communicator has no Runtime: create it with "
                             "strata.Communicator.from_environment(runtime)")
        options = to_options(stage, mp_policy, offload_policy, fetch_policy, reduce_policy,
                             optimizer)
        self.mp_policy = mp_policy or MixedPrecisionPolicy()
        self.offload_policy = offload_policy or PlacementPolicy()
        self.fetch_policy = fetch_policy or FetchPolicy()
        self.reduce_policy = reduce_policy or ReducePolicy()
        self.optimizer = optimizer or ZeroAdamW()
        param_dtype = self.mp_policy.param_dtype
        order = self.fetch_policy.order
        self.module = module
        self.comm = comm
        self.runtime = comm.runtime
        self.tier = tier
        self.param_dtype = param_dtype
        self._params: list[_Param] = []
        self._units: list[_Unit] = []
        self._by_param: dict[int, _Param] = {}
        self._hooks = []
        self._forward_depth = 0
        self._in_backward = False
        self._recomputing: list[bool] = []  # per unit forward running: re-run in backward?
        self._held_pushes = 0  # gradients held to the end of a backward and pushed then
        # Where forward and backward compute: the acquired memory's device. The GPU tier of a
        # CUDA runtime is device memory on the runtime's GPU (STRATA_DEVICE, else LOCAL_RANK):
        # the placeholders, the gradient accumulators' metadata and the buffers go there.
        if tier not in ("gpu", "cpu"):
            raise ValueError(f"tier={tier!r}: use 'gpu' (the GPU tier: device memory on a CUDA "
                             "runtime) or 'cpu'")
        self._cuda = tier == "gpu" and self.runtime.backend == "cuda"
        self.device = (torch.device("cuda", int(self.runtime.config["device"])) if self._cuda
                       else torch.device("cpu"))
        if device is not None and torch.device(device).type != self.device.type:
            raise ValueError(f"device={device!r}: the module computes on {self.device} (tier "
                             f"{tier!r} of a {self.runtime.backend} runtime); pass device=None or "
                             f"'{self.device}'")

        # Parameters on the meta device (a model too large to build in host memory): empty ones
        # on the compute device instead, their values from param_init as the engine is created.
        shapes, meta = _replace_meta_parameters(module, self.device, comm.runtime, param_init)
        for sub in module.modules():  # the buffers where forward computes (a CPU-built module)
            for key, b in sub._buffers.items():
                if b is not None and b.device != self.device:
                    sub._buffers[key] = b.to(self.device)

        # Units and their parameters, in module order. Each parameter is registered once (under
        # its first name) in module order, which should be the order forward uses them: stage
        # 2-3 buckets are filled in the reverse order (backward's), and a group whose gradients
        # arrive out of that order holds a bucket until its last one.
        owners = _unit_owners(module, units)
        modules = dict(module.named_modules())
        unit_params: dict[str, list] = {}
        first_names = {}
        for name, sub in module.named_modules():
            for pname, p in sub.named_parameters(recurse=False):
                owner = owners[name]
                unit_params.setdefault(owner, [])
                if all(q is not p for q in unit_params[owner]):
                    unit_params[owner].append(p)
                first_names.setdefault(id(p), f"{name}.{pname}" if name else pname)
        ordered = []
        for p in module.parameters():  # module order, each once
            ordered.append(p)
        if not ordered:
            raise ValueError("the module has no parameters")

        # Initial values: rank 0's (sync_module_states), so that every rank starts the same; a
        # meta parameter's from param_init (the same on every rank by its contract: no
        # broadcast), drawn by the engine as it sets up the parameter's group, so that no fp32
        # copy of the whole model ever exists on the host.
        def drawn(p):
            name, shape = first_names[id(p)], shapes[id(p)]
            return lambda: _initial_values(p, name, shape, param_init)
        values = [drawn(p) if id(p) in meta else
                  p.detach().to("cpu", torch.float32).reshape(-1).numpy() for p in ordered]
        if sync_module_states and comm.size > 1 and not meta:
            flat = comm.broadcast(np.concatenate(values).astype(np.float32, copy=False), 0)
            at = 0
            for i, v in enumerate(values):
                values[i] = flat[at:at + v.size]
                at += v.size
        frozen = any(not p.requires_grad for p in ordered)
        specs = [(first_names[id(p)], shapes[id(p)], v, 0 if p.requires_grad else 1)
                 for p, v in zip(ordered, values)]
        del values
        if frozen:  # group 1: the frozen parameters, never changed
            options.groups = [{}, {"lr": 0.0, "weight_decay": 0.0}]
        self.engine = strata.ZeroEngine(self.runtime, comm, specs, options)

        with torch.enable_grad():
            for pid, p in enumerate(ordered):
                placeholder = torch.empty(0, dtype=param_dtype, device=self.device)
                prm = _Param(first_names[id(p)], p, pid, p.dtype, placeholder)
                # The parameter's dtype, device and shape (one element, expanded) while its
                # gradient accumulator is made: autograd checks gradients against them. Later
                # data of the same dtype and device keeps the accumulator.
                p.data = torch.zeros((), dtype=param_dtype, device=self.device).expand(
                    shapes[id(p)])
                self._params.append(prm)
                self._by_param[id(p)] = prm
                if p.requires_grad:
                    self._register_grad_hooks(prm)
                p.data = placeholder
        for owner, params in unit_params.items():
            unit = _Unit(owner, modules[owner], [self._by_param[id(p)] for p in params])
            self._units.append(unit)
            self._hooks.append(unit.module.register_forward_pre_hook(
                lambda mod, inputs, unit=unit: self._pre_forward(unit)))
            self._hooks.append(unit.module.register_forward_hook(
                lambda mod, inputs, output, unit=unit: self._post_forward(unit, output)))
        # Uses: every module call with parameters of its own counts them (a module called twice,
        # a parameter shared by two modules), whatever the units.
        for sub in module.modules():
            direct = []
            for p in sub.parameters(recurse=False):
                prm = self._by_param[id(p)]
                if p.requires_grad and prm not in direct:
                    direct.append(prm)
            if direct:
                self._hooks.append(sub.register_forward_pre_hook(
                    lambda mod, inputs, direct=direct: self._count_uses(direct)))
        if order == "module":
            forward = [prm.pid for unit in self._units for prm in unit.params]
            self.engine.set_fetch_order(forward + forward[::-1])

    # ---- the training step -----------------------------------------------------------------

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        self._forward_depth += 1
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                output = self.module(*args, **kwargs)
            # Backward begins at these outputs' gradients, before any node of the module runs:
            # an activation-checkpointed unit's forward re-run there is then known as one.
            for t in _tensors_in(output):
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(lambda grad: self._begin_backward())
            return output
        except BaseException:
            self.release_all()
            self._recomputing.clear()  # units whose forward raised never reached their post-hook
            raise
        finally:
            self._forward_depth -= 1

    def step(self) -> dict:
        """After accumulation_steps backward passes: strata's step on every rank (clipping and
        the overflow check over all ranks; stage 1-2: the parameters all-gathered). Returns
        its result (skipped, grad_norm, clip_coef, params_updated, step, loss_scale), the same
        on every rank. Collective."""
        self.release_all()
        return self.engine.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops the gradients of the micro-steps since the last step (collective)."""
        self.release_all()
        self.engine.zero_grad()
        for prm in self._params:
            prm.param.grad = None
            prm.grad_seen = False
            prm.grad_held = False
            prm.uses = 0

    def set_lr(self, lr: float) -> None:
        """The learning rate of the steps to come (the trainable parameters' group): a schedule
        calls it between step() and the next forward, on every rank with the same value."""
        self.engine.set_lr(float(lr), 0)

    @property
    def lr(self) -> float:
        """The learning rate the next step uses (ZeroAdamW's lr, or set_lr's; float32)."""
        return self.engine.group(0)["lr"]

    @property
    def loss_scale(self) -> float:
        """Multiply the loss by this before backward when loss scaling is on (loss_scale=,
        dynamic_loss_scale=); strata divides it out of the gradients."""
        return self.engine.loss_scale

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.size

    # ---- acquisitions ----------------------------------------------------------------------

    def _torch_stream(self):
        """The stream torch issues its work on the acquired memory on: its current CUDA stream
        on the compute device (in backward, the autograd node's). None on the CPU, where
        torch's work is done when its call returns. (Tests on the host backend put a
        strata.Stream here, to run this module's CUDA ordering without a GPU.)"""
        if self._cuda:
            return torch.cuda.current_stream(self.device)
        return None

    def _view(self, acquisition, stream):
        """The acquired memory as a torch tensor, zero copy. Acquired for `stream`, the engine
        has ordered it after its work on the memory (a gather, a copy, the previous
        reduce-scatter of a gradient bucket) on the device: the host does not wait.
        stream=None (the CPU): the host waits for strata's ready event, as the host is then
        torch's stream."""
        return torch.utils.dlpack.from_dlpack(acquisition.__dlpack__(stream=stream))

    def _acquire(self, prm: _Param) -> None:
        stream = self._torch_stream()
        acquisition = self.engine.acquire_param(prm.pid, self.tier, "r", stream=stream)
        if not prm.acquisitions:
            prm.param.data = self._view(acquisition, stream)
        prm.acquisitions.append(acquisition)

    def _release(self, prm: _Param) -> None:
        acquisition = prm.acquisitions.pop()
        if not prm.acquisitions:
            prm.param.data = prm.placeholder  # drops the DLPack view before the release
        # An event on torch's stream: strata reuses the memory (a dropped group's, a kept
        # group's next gather) only after the work torch issued on it so far. No host wait.
        acquisition.release(stream=self._torch_stream())

    def _acquire_for_backward(self, prm: _Param) -> None:
        if not prm.acquisitions:
            self._acquire(prm)
            prm.backward_held = True

    def release_all(self) -> None:
        """Releases every parameter still acquired (step() and the end of backward do it)."""
        for prm in self._params:
            while prm.acquisitions:
                self._release(prm)
            prm.backward_held = False

    # ---- hooks -----------------------------------------------------------------------------

    def _pre_forward(self, unit: _Unit):
        recompute = torch.is_grad_enabled() and self._forward_depth == 0
        if recompute and not self._in_backward:
            raise RuntimeError(
                f"unit '{unit.name or '(root)'}' of a ZeroModule ran outside the ZeroModule's "
                "forward with autograd on: call the ZeroModule itself (its forward keeps "
                "autograd from holding released parameters), or run under torch.no_grad()")
        self._recomputing.append(recompute)
        if recompute:
            # Activation checkpointing re-runs the unit's forward in backward (reentrant: a
            # graph of its own; non-reentrant: its saved tensors kept by the checkpoint), and
            # the backward that follows reads the parameters as saved then, outside the
            # saved-tensor hooks: they stay acquired until their gradients are in.
            for prm in unit.params:
                self._acquire_for_backward(prm)
            return None
        for prm in unit.params:
            self._acquire(prm)
        return None

    def _post_forward(self, unit: _Unit, output):
        recompute = self._recomputing.pop() if self._recomputing else False
        if not recompute:
            for prm in reversed(unit.params):
                self._release(prm)
        if torch.is_grad_enabled():
            for t in _tensors_in(output):
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(lambda grad, unit=unit: self._pre_backward(unit))
        return None

    def _count_uses(self, prms) -> None:
        # Forward inside the wrapper only (a re-run in backward is no new use; evaluation has
        # no backward), reentrant checkpointing's no-grad forward included.
        if self._forward_depth > 0:
            for prm in prms:
                prm.uses += 1

    def _begin_backward(self) -> None:
        if not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def _pre_backward(self, unit: _Unit):
        self._begin_backward()
        for prm in unit.params:
            self._acquire_for_backward(prm)
        return None

    def _pack(self, tensor):
        prm = self._by_param.get(id(tensor))
        if prm is not None and prm.param is tensor:
            return _Saved(prm, None)
        base = tensor._base
        if base is not None:
            prm = self._by_param.get(id(base))
            if prm is not None and prm.param is base:
                offset = tensor.storage_offset() - base.storage_offset()
                return _Saved(prm, (tuple(tensor.size()), tuple(tensor.stride()), offset))
        return tensor

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        prm = saved.prm
        if not prm.acquisitions:  # no output hook reached its unit first
            self._begin_backward()
            self._acquire_for_backward(prm)
        if saved.view is None:
            return prm.param
        size, stride, offset = saved.view
        data = prm.param.detach()
        return data.as_strided(size, stride, data.storage_offset() + offset)

    def _register_grad_hooks(self, prm: _Param) -> None:
        p = prm.param
        # Before the gradient is accumulated: the parameter must be its real memory then
        # (AccumulateGrad lays the gradient out as the parameter).
        self._hooks.append(p.register_hook(lambda grad, prm=prm: self._before_accumulate(prm)))
        # After it: a hook on the parameter's AccumulateGrad node, kept alive here (as FSDP1
        # does; torch 1.13 has no register_post_accumulate_grad_hook, and one path for every
        # version is the tested one). The node checks gradients against the parameter's shape
        # when it is made, which is why __init__ gives the parameter its shape meanwhile.
        prm.accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        self._hooks.append(prm.accumulator.register_hook(
            lambda grad_inputs, grad_outputs, prm=prm: self._after_accumulate(prm)))

    def _before_accumulate(self, prm: _Param):
        self._begin_backward()
        self._acquire_for_backward(prm)
        return None

    def _after_accumulate(self, prm: _Param) -> None:
        grad = prm.param.grad
        if grad is None:
            return
        if prm.uses > 1:
            # Used more than once: another part of its gradient may still come in this backward
            # (a checkpointed segment's backward runs on its own). It waits in param.grad, where
            # AccumulateGrad adds the next part, and goes to the engine when backward ends.
            prm.grad_held = True
        else:
            prm.param.grad = None  # the gradient lives in strata
            self._push_grad(prm, grad)
        if prm.backward_held:
            prm.backward_held = False
            self._release(prm)

    def _push_grad(self, prm: _Param, grad) -> None:
        """Adds `grad` (None: nothing, a zero gradient) into the engine's buffer of this
        micro-step and marks it ready."""
        stream = self._torch_stream()
        acquisition = self.engine.acquire_grad(prm.pid, self.tier, stream=stream)
        try:
            if grad is not None:
                # torch's stream waits for the bucket (its previous reduce-scatter's reads);
                # the add runs there, on the device, while backward goes on.
                dst = self._view(acquisition, stream)
                dst.add_(grad.detach().reshape(dst.shape))
                del dst
        finally:
            # grad_ready after the add on torch's stream: the engine's comm stream waits for
            # an event there before its reduce-scatter reads the bucket.
            acquisition.release(stream=stream)
        prm.grad_seen = True

    def _backward_done(self) -> None:
        self._in_backward = False
        self._recomputing.clear()
        # The engine takes every parameter's gradient every micro-step: zeros for those this
        # backward did not reach (unused in this forward, frozen), in the same order on every
        # rank.
        for prm in self._params:
            if prm.grad_held:  # all its parts are in param.grad now
                grad = prm.param.grad
                prm.param.grad = None
                prm.grad_held = False
                self._push_grad(prm, grad)
                self._held_pushes += 1
            elif not prm.grad_seen:
                self._push_grad(prm, None)
            prm.grad_seen = False
            prm.uses = 0
        self.release_all()

    # ---- inspection ------------------------------------------------------------------------

    def read_parameter(self, name: str) -> torch.Tensor:
        """A CPU float32 copy of a parameter's current value (stage 3 gathers it: collective)."""
        for prm in self._params:
            if prm.name == name:
                return torch.from_numpy(self.engine.read_param(prm.pid))
        raise KeyError(f"no parameter named {name!r}")

    @property
    def units(self) -> list:
        """[(unit name, [parameter names])] in module order."""
        return [(unit.name, [prm.name for prm in unit.params]) for unit in self._units]

    def stats(self) -> dict:
        return self.engine.stats()

    def memory(self) -> dict:
        return self.engine.memory()

    def close(self) -> None:
        """Releases everything, removes the hooks and drops the engine (the parameters stay
        placeholders). The hooks on the module's parameters keep the engine, and with it the
        Communicator, alive: close() before the process ends lets the job end cleanly."""
        if self.engine is None:
            return
        self.release_all()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for prm in self._params:
            prm.accumulator = None
        self.engine = None


def zero_shard(module: nn.Module, comm: "strata.Communicator", *, stage: int = 3, units=None,
               mp_policy: MixedPrecisionPolicy | None = None,
               offload_policy: PlacementPolicy | None = None,
               fetch_policy: FetchPolicy | None = None, reduce_policy: ReducePolicy | None = None,
               optimizer: ZeroAdamW | None = None, tier: str = "gpu",
               sync_module_states: bool = True, param_init=None, device=None,
               **moved) -> ZeroModule:
    """Wraps `module` for ZeRO-DP training over `comm`'s ranks (every rank calls it, with the
    same module and arguments), FSDP2's fully_shard's shape: keyword-only, grouped in frozen
    policy objects (zero_policy.py; None: that policy's defaults).

    stage: 1 (Adam states partitioned), 2 (gradients too), 3 (parameters too).
    units: None (every module with parameters of its own), a module class, a list or tuple of
        them, or a predicate (name, module) -> bool: each such subtree is one unit, gathered
        and released whole.
    mp_policy: MixedPrecisionPolicy (param_dtype, reduce_dtype, loss scaling).
    offload_policy: PlacementPolicy (param_home: gpu/cpu/nvme; state_home: cpu/nvme), or
        FSDP2's CPUOffloadPolicy() (both in the CPU tier). The optimizer step always runs on the
        CPU: there is no "no offload" of the optimizer states (zero_policy.py's OffloadPolicy).
    fetch_policy: FetchPolicy (stage 3: order, prefetch_bytes, max_live_bytes, ...).
    reduce_policy: ReducePolicy (bucket_bytes, gradient_buckets, alignment,
        accumulation_steps).
    optimizer: ZeroAdamW (lr, betas, eps, weight_decay, decoupled, max_grad_norm).
    tier: where the module computes: 'gpu' (the GPU tier: device memory on the cuda backend,
        host memory on the host backend) or 'cpu'.
    sync_module_states: every rank starts from rank 0's values (a broadcast).
    param_init: for a module built on the meta device (no memory behind its parameters):
        fn(name, shape) -> that parameter's initial values (a tensor or array of the shape's
        element count), called once per parameter under its first name, and the same on every
        rank (no broadcast). The meta parameters become empty ones on `device` (None: cuda on a
        CUDA runtime, else cpu); the module's fp32 values exist only as the engine is fed.
    The engine is created with to_options(...) of these: model.engine.options shows it."""
    if moved:
        raise TypeError(_moved_message(moved))
    return ZeroModule(module, comm, stage=stage, units=units, mp_policy=mp_policy,
                      offload_policy=offload_policy, fetch_policy=fetch_policy,
                      reduce_policy=reduce_policy, optimizer=optimizer, tier=tier,
                      sync_module_states=sync_module_states, param_init=param_init,
                      device=device)
