"""zero_shard of a module built on the meta device (imported by strata.zero_torch): its meta
parameters replaced by empty ones on the compute device, their initial values drawn from the
caller's param_init by the engine as it sets up each flat group, so that no fp32 copy of the
whole model ever exists on the host."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _replace_meta_parameters(module: nn.Module, device, runtime, param_init):
    """({id(parameter): shape} of every parameter, {ids of those that were on the meta device}):
    each meta parameter replaced, in every module that holds it (tied ones stay tied), by an
    empty one on `device` (zero_shard's compute device)."""
    shapes, meta, fresh = {}, set(), {}
    for m in module.modules():
        for key, p in list(m._parameters.items()):
            if p is None:
                continue
            if not p.is_meta:
                shapes[id(p)] = tuple(p.shape)
                continue
            if param_init is None:
                raise ValueError(f"parameter {key!r} of {type(m).__name__} is on the meta device: "
                                 "pass param_init=fn(name, shape) -> its initial values (the "
                                 "same on every rank), or materialize the module first")
            if id(p) not in fresh:
                where = device or ("cuda" if runtime.backend == "cuda" else "cpu")
                new = nn.Parameter(torch.empty(0, dtype=p.dtype, device=where),
                                   requires_grad=p.requires_grad)
                fresh[id(p)] = new
                shapes[id(new)] = tuple(p.shape)
                meta.add(id(new))
            m._parameters[key] = fresh[id(p)]
    for name, b in module.named_buffers():
        if b.is_meta:
            raise ValueError(f"buffer {name!r} is on the meta device: materialize the module's "
                             "buffers first (zero_shard fills only parameters from param_init)")
    return shapes, meta


def _initial_values(p, name: str, shape, param_init):
    """param_init(name, shape) as a flat float32 numpy array of the shape's element count."""
    value = param_init(name, shape)
    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu", torch.float32).reshape(-1).numpy()
    value = np.asarray(value, dtype=np.float32).reshape(-1)
    want = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if value.size != want:
        raise ValueError(f"param_init({name!r}, {shape}) gave {value.size} values; the "
                         f"parameter has {want}")
    return value
