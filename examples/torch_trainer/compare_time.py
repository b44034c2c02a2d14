"""How compare.py shares its comparison time among the systems (no torch here).

An equal share starves the one system whose step is bound by the disk: at the GPU defaults
(537 M parameters) strata-nvme's step reads one slot of Adam states and writes the other, ~13 GB
a step, which the GPU machine's virtual disk (1.8-3 GB/s, ../shared/GPU.md) needs seconds for,
while every other system's five steps take about as long as its start. So each system's time is
estimated from the bytes its step moves through its slowest place (NVMe, host memory), and a
system may run for its estimate plus whatever the others' estimates leave; when the estimates do
not fit, each gets its proportional part. Estimates, not measurements: the rates are the GPU
machine's lower figures, and a system done early leaves its time to the ones after it.
"""

from __future__ import annotations

from compare_budget import ADAM_STATE_BYTES, need

# A worker's start on each device: Python, torch, CUDA context, NCCL, the model, the first step.
START_S = {"cuda": 15.0, "cpu": 3.0}
# The GPU machine's disk (GPU.md: 1.8-3 GB/s) and a CPU Adam's memory traffic, at their lower
# ends: an underestimate here would kill a run that was on its way.
NVME_BYTES_PER_S = 1.5e9
HOST_ADAM_BYTES_PER_S = 15e9
# A CPU Adam step reads the fp32 master, both moments and the gradient, writes the first three.
HOST_ADAM_TRAFFIC = ADAM_STATE_BYTES + 4 + ADAM_STATE_BYTES
CPU_OPTIMIZER_SYSTEMS = ("strata-cpu", "strata-nvme", "fsdp2")


def expected_s(system: str, model, device: str, steps: int, settings=None) -> float:
    """Seconds one worker of `system` should need for `steps` steps of `model`: its start plus,
    each step, the NVMe traffic (strata-nvme: need()'s NVMe bytes, both state slots and the
    shard, about what a step reads and writes; once more at the start, when registration writes
    them) and the CPU optimizer's memory traffic."""
    start, per_step = START_S[device], 0.0
    if system in CPU_OPTIMIZER_SYSTEMS:
        per_step += model.parameters() * HOST_ADAM_TRAFFIC / HOST_ADAM_BYTES_PER_S
    if system == "strata-nvme":
        nvme_s = need(system, model, device, settings).nvme / NVME_BYTES_PER_S
        start += nvme_s  # registration writes the initial states and shards once
        per_step += nvme_s
    return start + steps * per_step


def limit_s(available: float, estimates: list) -> float:
    """The time the first of `estimates` (the systems still to run, in order) may take out of
    `available` seconds: its estimate plus the slack the others' estimates leave, or, when the
    estimates do not fit, its proportional part (and the others are held to theirs)."""
    total = sum(estimates)
    if available <= 0 or total <= 0:
        return max(available, 0.0)
    scale = min(1.0, available / total)
    return available - (total - estimates[0]) * scale
