"""compare.py's verdict on the losses (no torch): which system is the reference, the bound each
system is held to, and which disagreements fail the run.

On a GPU every system computes in bf16 but plain torch (fp32 parameters under bf16 autocast), so
the reference is FSDP2 with the same bf16 policy as strata (MixedPrecisionPolicy bf16/bf16):
fsdp2 (CPUOffloadPolicy), else fsdp2-nooffload. strata-* must stay within `tolerance` of it: a
disagreement fails the run. The spread between the two FSDP2 runs (the same model and data, the
optimizer on the CPU against the GPU) is the noise of bf16 training itself: it is measured and
reported beside the bound. Plain torch is informative: held to its own, looser `torch_tolerance`,
and outside it it is reported, not failed (its arithmetic is not the others').

On the CPU (fp32 everywhere; no FSDP2 on Debian's torch) the reference is plain torch and every
system, strata's included, is held to `tolerance` (1e-5: the AdamW sums' order).

A non-finite loss (None in a worker's JSON, or NaN/inf) fails its system, whatever the bounds.
"""

from __future__ import annotations

import math

REFERENCES = {"cuda": ("fsdp2", "fsdp2-nooffload", "strata-cpu", "strata-nvme", "torch"),
              "cpu": ("torch", "strata-cpu", "strata-nvme", "fsdp2", "fsdp2-nooffload")}


def relative(a, b) -> float:
    """|a - b| / |b|; inf when either is missing or not finite."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)


def worst_relative(losses, reference) -> tuple[float, int]:
    """The largest relative difference over the common steps, and its step (1-based)."""
    worst, at = 0.0, 0
    for step, (a, b) in enumerate(zip(losses, reference), 1):
        r = relative(a, b)
        if r > worst or (math.isinf(r) and not math.isinf(worst)):
            worst, at = r, step
    return worst, at


def agree(losses: dict, device: str, tolerance: float, torch_tolerance: float) -> dict:
    """`losses`: {system: [loss per step, None where not finite]} of the systems that trained.
    Returns {"reference", "rows": [{"system", "worst", "step", "bound", "binding", "ok"}],
    "fsdp2_spread", "failures": [row, ...], "ok"}."""
    order = REFERENCES[device]
    finite = {s for s, v in losses.items()
              if all(x is not None and math.isfinite(x) for x in v)}
    reference = next((s for s in order if s in finite), None)
    rows, failures = [], []
    for system, mine in losses.items():
        if any(v is None or not math.isfinite(v) for v in mine):
            step = next(i for i, v in enumerate(mine, 1) if v is None or not math.isfinite(v))
            row = {"system": system, "worst": math.inf, "step": step, "bound": None,
                   "binding": True, "ok": False, "why": f"non-finite loss at step {step}"}
            rows.append(row)
            failures.append(row)
            continue
        if system == reference or reference is None:
            continue
        worst, step = worst_relative(mine, losses[reference])
        if len(mine) != len(losses[reference]):
            worst, step = math.inf, min(len(mine), len(losses[reference])) + 1
        informative = device == "cuda" and (system == "torch" or system.startswith("fsdp2"))
        bound = torch_tolerance if device == "cuda" and system == "torch" else tolerance
        ok = worst <= bound
        row = {"system": system, "worst": worst, "step": step, "bound": bound,
               "binding": not informative, "ok": ok}
        if not ok:
            row["why"] = (f"step {step}: relative {worst:.3g} > {bound:g}"
                          + (" (informative: not a failure)" if informative else ""))
        rows.append(row)
        if not ok and not informative:
            failures.append(row)
    spread = None
    if "fsdp2" in losses and "fsdp2-nooffload" in losses:
        spread = worst_relative(losses["fsdp2-nooffload"], losses["fsdp2"])[0]
    return {"reference": reference, "rows": rows, "fsdp2_spread": spread,
            "failures": failures, "ok": not failures}
