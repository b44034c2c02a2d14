"""ZeroModule's state: whole state dicts gathered on rank 0, and sharded checkpoints that load at
any world size (strata.torch's ZeRO wrapper, zero_torch.py, mixes this class in; docs/python.md)."""

from __future__ import annotations

import os
from collections import OrderedDict

import torch

_BUFFERS_FILE = "strata_torch_buffers.pt"
_FORMAT = "strata.torch.ZeroModule/1"


class _ZeroModuleState:
    """The state-dict and checkpoint methods of ZeroModule. They use its engine, comm, module,
    rank, _params and release_all()."""

    def full_state_dict(self, rank0_only: bool = True) -> "OrderedDict[str, torch.Tensor]":
        """The module's state_dict with every parameter whole (the fp32 master, in the
        parameter's original dtype) and the buffers of this rank's module. Collective: every
        rank calls it; with rank0_only only rank 0 gets the dict (the others an empty one).
        Load it into a plain nn.Module of the same architecture."""
        self.release_all()
        values = {}
        for prm in self._params:
            master, _, _ = self.engine.read_state(prm.pid)
            if not rank0_only or self.rank == 0:
                values[id(prm.param)] = torch.from_numpy(master).to(prm.dtype)
        if rank0_only and self.rank != 0:
            return OrderedDict()
        out = OrderedDict()
        for key, value in self.module.state_dict(keep_vars=True).items():
            out[key] = values[id(value)] if id(value) in values else value.detach().clone()
        return out

    def full_optimizer_state_dict(self, rank0_only: bool = True) -> dict:
        """{"step": steps taken, "state": {name: {"exp_avg", "exp_avg_sq"}}}, whole and fp32
        (torch.optim.AdamW's moments). Collective, as full_state_dict()."""
        self.release_all()
        state = {}
        for prm in self._params:
            _, exp_avg, exp_avg_sq = self.engine.read_state(prm.pid)
            state[prm.name] = {"exp_avg": torch.from_numpy(exp_avg),
                               "exp_avg_sq": torch.from_numpy(exp_avg_sq)}
        if rank0_only and self.rank != 0:
            return {}
        return {"step": self.engine.step_count, "state": state}

    def save_sharded(self, directory) -> None:
        """Collective: every rank writes its shards of the parameters and optimizer states into
        `directory` (shared by the ranks), rank 0 the manifest and its buffers.
        load_sharded() reads it at any world size."""
        self.release_all()
        directory = os.fspath(directory)
        self.engine.save(directory)
        if self.rank == 0:
            buffers = {name: b.detach().cpu().clone() for name, b in self.module.named_buffers()}
            torch.save({"format": _FORMAT, "params": [prm.name for prm in self._params],
                        "buffers": buffers}, os.path.join(directory, _BUFFERS_FILE))
        self.comm.barrier()  # the file is there before any rank goes on to read it

    def load_sharded(self, directory) -> None:
        """Collective: loads a checkpoint of save_sharded(), written at any world size, stage
        or bucket size (the engine reshards it), and rank 0's buffers."""
        self.release_all()
        directory = os.fspath(directory)
        self.engine.load(directory)
        path = os.path.join(directory, _BUFFERS_FILE)
        if os.path.exists(path):
            saved = torch.load(path)
            if saved.get("format") != _FORMAT:
                raise ValueError(f"{path} is not a strata.torch.ZeroModule checkpoint")
            buffers = dict(self.module.named_buffers())
            for name, value in saved["buffers"].items():
                if name in buffers:
                    buffers[name].data.copy_(value)

    def state_dict(self, *args, **kwargs):
        raise RuntimeError("ZeroModule's parameters live in strata: use full_state_dict() "
                           "(collective, gathered on rank 0) or save_sharded(directory)")

    def load_state_dict(self, *args, **kwargs):
        raise RuntimeError("ZeroModule loads with load_sharded(directory); a full state dict "
                           "loads into a plain nn.Module")
