"""strata.torch.zero_shard's policies (imported by strata.torch): small frozen objects, each
mirroring a part of the C++ option structs (include/strata/zero/zero_engine.h's ZeroOptions
and offload_optimizer.h's OffloadOptimizerOptions), as FSDP2's fully_shard takes
MixedPrecisionPolicy and OffloadPolicy:

    model = st.zero_shard(net, comm, stage=3,
                          mp_policy=st.MixedPrecisionPolicy(param_dtype=torch.bfloat16),
                          offload_policy=st.PlacementPolicy(param_home="cpu", state_home="nvme"),
                          fetch_policy=st.FetchPolicy(prefetch_bytes="256MiB"),
                          reduce_policy=st.ReducePolicy(bucket_bytes="32MiB"),
                          optimizer=st.ZeroAdamW(lr=3e-4, weight_decay=0.1, max_grad_norm=1.0))

Each checks its fields when it is made: a wrong type or value raises, naming the field
("FetchPolicy.max_live_bytes=0: ..."). The defaults are the C++ defaults, except the dtypes
(float32: the torch module's; the C++ engine's default is float16). to_options() turns them into
a strata.ZeroOptions (bound field by field), which the engine is created with.

FSDP2's names: MixedPrecisionPolicy (param_dtype, reduce_dtype) means what FSDP2's does;
CPUOffloadPolicy(pin_memory=True) is FSDP2's (parameters and optimizer states in the pinned CPU
tier); strata's own placement policy is PlacementPolicy (param_home, state_home). OffloadPolicy
with fields is PlacementPolicy's earlier name; OffloadPolicy() is FSDP2's "no offload", which
strata can honour for the parameters only: its optimizer step always runs on the CPU
(ZeRO-Offload), so the optimizer states live in the CPU tier, and a warning says so.
docs/python.md, "From FSDP2 to strata", has the whole translation.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

import strata

__all__ = ["MixedPrecisionPolicy", "PlacementPolicy", "OffloadPolicy", "CPUOffloadPolicy",
           "FetchPolicy", "ReducePolicy", "ZeroAdamW", "to_options"]

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_HOMES = ("gpu", "cpu", "nvme")


def _where(obj, field: str, value) -> str:
    return f"{type(obj).__name__}.{field}={value!r}"


def _check_dtype(obj, field: str) -> None:
    value = getattr(obj, field)
    if value not in _DTYPES:
        raise ValueError(f"{_where(obj, field, value)}: use torch.float32, torch.float16 or "
                         "torch.bfloat16")


def _check_bytes(obj, field: str, allow_zero: bool, allow_none: bool = False) -> None:
    value = getattr(obj, field)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{_where(obj, field, value)} ({type(value).__name__}): use "
                        + ("None (automatic), " if allow_none else "")
                        + "a byte count (int) or a size ('32MiB')")
    n = value
    if isinstance(value, str):
        try:
            n = strata.parse_size(value)
        except (ValueError, strata.Error) as e:
            raise ValueError(f"{_where(obj, field, value)}: {e}") from None
    if n < 0 or (n == 0 and not allow_zero):
        raise ValueError(f"{_where(obj, field, value)}: use a "
                         f"{'byte count >= 0' if allow_zero else 'positive byte count'}")


def _check_number(obj, field: str, lo=None, hi=None, integer=False) -> None:
    value = getattr(obj, field)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{_where(obj, field, value)} ({type(value).__name__}): use "
                        f"{'an int' if integer else 'a number'}")
    if value != value or (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"at least {lo}" if hi is None else f"from {lo} to {hi}"
        raise ValueError(f"{_where(obj, field, value)}: use a value {bounds}")


def _check_bool(obj, field: str) -> None:
    value = getattr(obj, field)
    if not isinstance(value, bool):
        raise TypeError(f"{_where(obj, field, value)} ({type(value).__name__}): use True or False")


def _check_choice(obj, field: str, choices) -> None:
    value = getattr(obj, field)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{_where(obj, field, value)}: use "
                         + ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}")


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPolicy:
    """The dtypes the model computes and reduces in (ZeroOptions.param_type, grad_type) and fp16
    loss scaling (OffloadOptimizerOptions.loss_scaling, skip_on_overflow). The fp32 master
    weights and Adam moments stay fp32 in the optimizer's home."""

    param_dtype: torch.dtype = torch.float32  # the parameters forward and backward use
    reduce_dtype: torch.dtype = torch.float32  # the gradients, as reduced and accumulated
    loss_scale: float = 1.0  # multiply the loss by model.loss_scale before backward
    dynamic_loss_scale: bool = False  # halve on overflow, grow after a run of good steps
    skip_on_overflow: bool = True  # a step with a non-finite gradient changes nothing

    def __post_init__(self):
        _check_dtype(self, "param_dtype")
        _check_dtype(self, "reduce_dtype")
        _check_number(self, "loss_scale", lo=0.0)
        if self.loss_scale == 0:
            raise ValueError(f"{_where(self, 'loss_scale', self.loss_scale)}: use a positive "
                             "scale (1.0: none)")
        _check_bool(self, "dynamic_loss_scale")
        _check_bool(self, "skip_on_overflow")


@dataclasses.dataclass(frozen=True)
class PlacementPolicy:
    """Where the model states live (ZeroOptions.param_home, OffloadOptimizerOptions.state_home):
    the parameters (stage 3: each rank's shards) in 'gpu', 'cpu' or 'nvme' (NVMe: stage 3);
    the fp32 master weights and Adam moments in 'cpu' (ZeRO-Offload) or 'nvme'
    (ZeRO-Infinity). There is no 'gpu' for them: strata's optimizer step always runs on the
    CPU, on the states where they live."""

    param_home: str = "gpu"
    state_home: str = "cpu"

    def __post_init__(self):
        _check_choice(self, "param_home", _HOMES)
        _check_choice(self, "state_home", ("cpu", "nvme"))


_NO_OFFLOAD = (
    "strata.torch.OffloadPolicy() is FSDP2's 'no offloading': strata keeps the parameters in "
    "the GPU tier as FSDP2 does, but the optimizer states cannot stay there: strata's optimizer "
    "step always runs on the CPU (ZeRO-Offload), so the fp32 master weights and Adam moments "
    "live in the CPU tier. Say so with strata.torch.PlacementPolicy(param_home='gpu', "
    "state_home='cpu'), which does not warn")


@dataclasses.dataclass(frozen=True)
class OffloadPolicy(PlacementPolicy):
    """FSDP2's name, two meanings told apart by the arguments. With param_home= or state_home=:
    strata's earlier name of PlacementPolicy, the same meaning (the unset one its default).
    Without arguments: FSDP2's OffloadPolicy(), "no offloading", which strata honours for the
    parameters only (the GPU tier); the optimizer states live in the CPU tier (strata's step
    always runs on the CPU), and a warning says so (PlacementPolicy() is the same placement,
    said outright)."""

    param_home: str | None = None
    state_home: str | None = None

    def __post_init__(self):
        if self.param_home is None and self.state_home is None:
            warnings.warn(_NO_OFFLOAD, UserWarning, stacklevel=3)
        if self.param_home is None:
            object.__setattr__(self, "param_home", "gpu")
        if self.state_home is None:
            object.__setattr__(self, "state_home", "cpu")
        super().__post_init__()


@dataclasses.dataclass(frozen=True)
class CPUOffloadPolicy(OffloadPolicy):
    """FSDP2's CPUOffloadPolicy(pin_memory=True): the parameters (stage 3: each rank's shards),
    gradients and optimizer states in the CPU tier, the optimizer step on the CPU; the same
    placement as PlacementPolicy(param_home='cpu', state_home='cpu'). The CPU tier is pinned
    host memory (STRATA_CPU_BYTES), so pin_memory=False is refused rather than ignored."""

    param_home: str = dataclasses.field(default="cpu", init=False)
    state_home: str = dataclasses.field(default="cpu", init=False)
    pin_memory: bool = True

    def __post_init__(self):
        _check_bool(self, "pin_memory")
        if not self.pin_memory:
            raise ValueError(
                "CPUOffloadPolicy.pin_memory=False: strata's CPU tier is pinned host memory, "
                "always (STRATA_CPU_BYTES sizes it); use pin_memory=True, a smaller CPU tier, "
                "or, where host memory is short, NVMe: PlacementPolicy(param_home='nvme', "
                "state_home='nvme') (stage 3)")


@dataclasses.dataclass(frozen=True)
class FetchPolicy:
    """Stage 3's parameter fetching (ZeroOptions' prefetch_bytes, max_live_bytes,
    reuse_window_bytes, persist_below_bytes) and the order it follows: 'record' (the first step
    records the order of use, later steps prefetch along it) or 'module' (units in module order,
    then reversed, given up front). Byte counts: an int or a size ('64MiB')."""

    order: str = "record"
    prefetch_bytes: int | str = "64MiB"  # gathered ahead of the group in use (0: none)
    # The most gathered bytes alive at once. None: automatic (1 GiB, or the largest group when
    # larger, fitted to the GPU tier: 3/4 of what it holds beside the engine's tensors; no
    # warning). A value above that fit is lowered to it with a warning.
    max_live_bytes: int | str | None = None
    reuse_window_bytes: int | str = "64MiB"  # a released group kept when reused this soon
    persist_below_bytes: int | str = "128KiB"  # smaller parameters stay whole on every rank

    def __post_init__(self):
        _check_choice(self, "order", ("record", "module"))
        _check_bytes(self, "prefetch_bytes", allow_zero=True)
        _check_bytes(self, "max_live_bytes", allow_zero=False, allow_none=True)
        _check_bytes(self, "reuse_window_bytes", allow_zero=True)
        _check_bytes(self, "persist_below_bytes", allow_zero=True)


@dataclasses.dataclass(frozen=True)
class ReducePolicy:
    """Gradient reduction (ZeroOptions' bucket_bytes, gradient_buckets, alignment,
    accumulation_steps): the gradient bytes of one flat group (one reduce-scatter), the
    buckets in use at once, the padding of every group (a multiple of ranks x alignment
    elements) and the backward passes per step()."""

    bucket_bytes: int | str = "32MiB"
    gradient_buckets: int = 2
    alignment: int = 64
    accumulation_steps: int = 1

    def __post_init__(self):
        _check_bytes(self, "bucket_bytes", allow_zero=False)
        _check_number(self, "gradient_buckets", lo=1, integer=True)
        _check_number(self, "alignment", lo=1, integer=True)
        _check_number(self, "accumulation_steps", lo=1, integer=True)


@dataclasses.dataclass(frozen=True)
class ZeroAdamW:
    """The optimizer of each rank's slice (OffloadOptimizerOptions: defaults, max_grad_norm,
    chunk_elements): AdamW (decoupled weight decay; decoupled=False: Adam with L2 decay) on
    strata's CPU kernel, torch.optim.AdamW's hyper-parameters (weight_decay defaults to 0, as
    strata's C++ does). max_grad_norm > 0 clips the global gradient norm over all ranks.
    overlap_step (OffloadOptimizerOptions.overlap): each group's Adam starts as its reduced
    slice is complete in the step's last micro-step, during backward, and model.step() keeps
    it or rolls it back (clipping, overflow): bitwise the plain step; overlap_max_host_bytes
    caps the CPU-tier bytes of its backups (0: the tier's capacity). It belongs here, not in
    OffloadPolicy: it changes when the optimizer's step runs, not where any state lives.
    zero_shard(optimizer=...) takes it; model.step() runs it."""

    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = True
    max_grad_norm: float = 0.0
    chunk_elements: int = 0  # elements per pipeline chunk (0: from the staging chunk size)
    overlap_step: bool = False  # Adam during backward, validated by step()
    overlap_max_host_bytes: int | str = 0  # cap on the overlap's backups (0: none of its own)

    def __post_init__(self):
        _check_number(self, "lr", lo=0.0)
        if not (isinstance(self.betas, (tuple, list)) and len(self.betas) == 2):
            raise TypeError(f"{_where(self, 'betas', self.betas)}: use a pair (beta1, beta2)")
        for b in self.betas:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < 1.0:
                raise ValueError(f"{_where(self, 'betas', self.betas)}: each in [0, 1)")
        object.__setattr__(self, "betas", tuple(float(b) for b in self.betas))
        _check_number(self, "eps", lo=0.0)
        _check_number(self, "weight_decay", lo=0.0)
        _check_bool(self, "decoupled")
        _check_number(self, "max_grad_norm", lo=0.0)
        _check_number(self, "chunk_elements", lo=0, integer=True)
        _check_bool(self, "overlap_step")
        _check_bytes(self, "overlap_max_host_bytes", allow_zero=True)


def _expect(value, cls, name: str, use: str = ""):
    if value is None:
        return cls()
    if not isinstance(value, cls):
        kind = type(value)
        if kind.__module__.startswith("torch.distributed"):
            # FSDP2's own policy object: strata.torch has the same names (with its meanings).
            raise TypeError(f"{name}={value!r} is torch's {kind.__module__}.{kind.__name__}: "
                            f"use strata.torch.{kind.__name__}(...) (the same name in "
                            "strata.torch; docs/python.md, 'From FSDP2 to strata')")
        raise TypeError(f"{name}={value!r} ({kind.__name__}): use "
                        + (use or f"strata.torch.{cls.__name__}(...)"))
    return value


def to_options(stage: int, mp_policy=None, offload_policy=None, fetch_policy=None,
               reduce_policy=None, optimizer=None) -> "strata.ZeroOptions":
    """The strata.ZeroOptions of a stage and the policies (None: the policy's defaults)."""
    mp = _expect(mp_policy, MixedPrecisionPolicy, "mp_policy")
    homes = _expect(offload_policy, PlacementPolicy, "offload_policy",
                    "strata.torch.PlacementPolicy(param_home=..., state_home=...) or FSDP2's "
                    "strata.torch.CPUOffloadPolicy()")
    fetch = _expect(fetch_policy, FetchPolicy, "fetch_policy")
    reduce = _expect(reduce_policy, ReducePolicy, "reduce_policy")
    adam = _expect(optimizer, ZeroAdamW, "optimizer")
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in (1, 2, 3):
        raise ValueError(f"stage={stage!r}: use 1, 2 or 3")
    if homes.param_home == "nvme" and stage != 3:
        raise ValueError(f"{type(homes).__name__}.param_home='nvme' needs stage 3 (stage={stage}: "
                         "the parameters are whole on every rank; use 'gpu' or 'cpu')")
    o = strata.ZeroOptions()
    o.stage = stage
    o.param_dtype = _DTYPES[mp.param_dtype]
    o.grad_dtype = _DTYPES[mp.reduce_dtype]
    o.param_home = homes.param_home
    for field in ("prefetch_bytes", "max_live_bytes", "reuse_window_bytes",
                  "persist_below_bytes"):
        setattr(o, field, getattr(fetch, field))
    for field in ("bucket_bytes", "gradient_buckets", "alignment", "accumulation_steps"):
        setattr(o, field, getattr(reduce, field))
    opt = o.optimizer
    opt.state_home = homes.state_home
    opt.max_grad_norm = adam.max_grad_norm
    opt.chunk_elements = adam.chunk_elements
    opt.overlap.enabled = adam.overlap_step
    opt.overlap.max_host_bytes = adam.overlap_max_host_bytes
    opt.skip_on_overflow = mp.skip_on_overflow
    opt.loss_scaling.scale = mp.loss_scale
    opt.loss_scaling.dynamic = mp.dynamic_loss_scale
    d = opt.defaults
    d.lr, d.betas, d.eps = adam.lr, adam.betas, adam.eps
    d.weight_decay, d.decoupled = adam.weight_decay, adam.decoupled
    return o


# Where the keywords of zero_shard before the policy objects went.
_MOVED = {
    "param_dtype": "mp_policy=MixedPrecisionPolicy(param_dtype=...)",
    "grad_dtype": "mp_policy=MixedPrecisionPolicy(reduce_dtype=...)",
    "loss_scale": "mp_policy=MixedPrecisionPolicy(loss_scale=...)",
    "dynamic_loss_scale": "mp_policy=MixedPrecisionPolicy(dynamic_loss_scale=...)",
    "skip_on_overflow": "mp_policy=MixedPrecisionPolicy(skip_on_overflow=...)",
    "param_home": "offload_policy=PlacementPolicy(param_home=...)",
    "state_home": "offload_policy=PlacementPolicy(state_home=...)",
    "order": "fetch_policy=FetchPolicy(order=...)",
    "prefetch_bytes": "fetch_policy=FetchPolicy(prefetch_bytes=...)",
    "max_live_bytes": "fetch_policy=FetchPolicy(max_live_bytes=...)",
    "reuse_window_bytes": "fetch_policy=FetchPolicy(reuse_window_bytes=...)",
    "persist_below_bytes": "fetch_policy=FetchPolicy(persist_below_bytes=...)",
    "bucket_bytes": "reduce_policy=ReducePolicy(bucket_bytes=...)",
    "gradient_buckets": "reduce_policy=ReducePolicy(gradient_buckets=...)",
    "alignment": "reduce_policy=ReducePolicy(alignment=...)",
    "accumulation_steps": "reduce_policy=ReducePolicy(accumulation_steps=...)",
    **{k: f"optimizer=ZeroAdamW({k}=...)" for k in ("lr", "betas", "eps", "weight_decay",
                                                     "decoupled", "max_grad_norm",
                                                     "chunk_elements", "overlap_step")},
}


def _moved_message(moved: dict) -> str:
    name = next(iter(moved))
    if name in _MOVED:
        return (f"zero_shard({name}=...): the options are grouped in policy objects now; use "
                f"strata.torch.{_MOVED[name]}")
    return (f"zero_shard() got an unexpected keyword argument {name!r} (use stage, units, "
            "mp_policy, offload_policy, fetch_policy, reduce_policy, optimizer, tier, "
            "sync_module_states, param_init, device)")
