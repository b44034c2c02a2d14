"""compare_search: each system's largest GPT by prediction, confirmed by two probes.

From the bytes a system needs in each place (compare_budget.need) and what the machine offers
(compare_budget.Resources), predict the largest layer count that fits at the comparison's width
and the resource that bounds it; then confirm with one-step probes (a process each, the
caller's) at the prediction and at 25% more parameters (rounded up to a layer count): the first
should train, the second should not fit, so the true limit lies between them. When the
prediction's probe does not fit, the prediction was wrong (a bug in the model of memory, to be
reported, not hidden): one more probe 25% lower says by how much. When the probe above trains
too, the prediction was low (room left unused): said too. No torch here.

    import compare_search
    found = compare_search.largest("strata-cpu", args, "cuda", resources, settings, probe,
                                   budget_s=60, say=print)

The probe is the caller's: probe(system, layers, limit_s) -> dict with "status" one of ok, oom
(did not fit: torch's or strata's out-of-memory, ResourceExhaustedError, a killed process),
failed (anything else), timeout, skipped; "error" or "skipped" says why; "seconds" how long it
took. It must run the same settings the prediction used (settings.batch sequences, one step,
strata's STRATA_* from compare_budget.strata_env) and must not refuse a size by
compare_budget.check: the probe above the prediction is meant to reach the real limit (a probe
answered "refused", not started, leaves the search inconclusive, saying so).
"""

from __future__ import annotations

import math
import time

import compare_budget as budget

PROBE_LIMIT_S = 30.0  # one probe's limit: meta construction, no data chain, one step
MIN_PROBE_S = 5.0  # a probe given less time than this is not started
STEP_UP, STEP_DOWN = 1.25, 0.75  # the probes around the prediction, in parameters

VERDICTS = {
    "confirmed": "the prediction trained and 25% more did not fit: the limit lies between",
    "prediction too high": "the prediction did not fit: the model of memory is wrong (a bug)",
    "prediction too low": "25% more than the prediction trained too: the model of memory "
                          "over-counts (room left unused)",
    "nothing fits": "not even one layer fits, as predicted",
    "max_layers": "the largest layer count allowed trained (settings.max_layers)",
    "failed": "a probe failed for another reason than memory (its error says which)",
    "unavailable": "the system does not run here (no probe started)",
    "inconclusive": "a probe ran out of time, was not started, or was refused before start "
                    "(the search's probes must not be checked against the prediction)",
}


def layers_above(model: budget.Model, layers: int, factor: float = STEP_UP) -> int:
    """The fewest layers (more than `layers`) with at least `factor` times the parameters."""
    want = factor * model.with_layers(layers).parameters()
    return max(layers + 1, math.ceil(model.layers_for(want) - 1e-9))


def layers_below(model: budget.Model, layers: int, factor: float = STEP_DOWN) -> int:
    """The most layers (fewer than `layers`, at least 1) with at most `factor` times the
    parameters; 0 when `layers` is 1."""
    if layers <= 1:
        return 0
    want = factor * model.with_layers(layers).parameters()
    return max(1, min(layers - 1, math.floor(model.layers_for(want) + 1e-9)))


def predict(system: str, model, device: str, resources: budget.Resources, settings=None) -> dict:
    """The prediction alone: {"layers", "parameters", "bound", "bound_bytes" (needed one layer
    more, in the bounding place), "available" (there), "need" (Need.as_dict at the prediction,
    or None)}."""
    m = budget.Model.of(model)
    fit = budget.largest_layers(system, m, device, resources, settings)
    bound, beyond = fit["bound"], fit["next_need"]
    needed = available = None
    if beyond is not None:
        for place, want, have in beyond.over(resources):
            if place == bound:
                needed, available = want, have
    return {"layers": fit["layers"], "parameters": fit["parameters"], "bound": bound,
            "bound_bytes": needed, "available": available,
            "need": fit["need"].as_dict() if fit["need"] is not None else None}


def _short(text, n=300):
    text = (text or "").strip()
    return text if len(text) <= n else text[:n - 3] + "..."


def largest(system: str, model, device: str, resources: budget.Resources, settings, probe,
            budget_s: float, say=print, probe_limit_s: float = PROBE_LIMIT_S) -> dict:
    """`system`'s largest model at `model`'s width on this machine: predicted, then probed.

    model: compare.py's args (or any object with vocab, seq_len, d_model, heads, layers);
    device: "cuda" or "cpu"; resources: compare_budget.Resources; settings: what the probes run
    with (compare_budget.Settings.of takes compare.py's args: batch = the probes' batch);
    probe(system, layers, limit_s) -> dict (the module docstring); budget_s: the seconds all
    probes may take together (each at most probe_limit_s); say: a print-like logger.

    Returns {"system", "predicted_layers", "predicted_parameters", "bound" (the place that
    bounds the prediction: gpu, host, pinned, nvme; or arena, max_live: strata's settings; or
    max_layers), "bound_bytes" (needed one layer more there), "available" (there),
    "need" (compare_budget.Need.as_dict at the prediction), "probes": [{"role" (prediction,
    above, below, one), "layers", "parameters", "status", "why", "seconds"}, ...],
    "confirmed_layers", "confirmed_parameters" (the largest probe that trained, or None),
    "first_not_fitting_layers" (the smallest probe that did not fit, or None), "verdict" (a key
    of VERDICTS), "verdict_means", "prediction_wrong" (True when a probe contradicted the
    prediction: too high or too low), "message" (one line for the log and the summary)}."""
    m = budget.Model.of(model)
    until = time.monotonic() + budget_s
    why = None
    if system == "strata-nvme" and not resources.nvme_path:
        why = "strata-nvme needs an NVMe directory (Resources.nvme_path)"
    try:
        budget.need(system, m, device, settings)
    except ValueError as e:
        why = str(e)
    if why:
        say(f"  largest {system}: unavailable: {why}")
        return {"system": system, "predicted_layers": None, "predicted_parameters": None,
                "bound": None, "bound_bytes": None, "available": None, "need": None,
                "probes": [], "confirmed_layers": None, "confirmed_parameters": None,
                "first_not_fitting_layers": None, "verdict": "unavailable",
                "verdict_means": VERDICTS["unavailable"], "prediction_wrong": False,
                "message": f"{system}: unavailable: {why}"}
    p = predict(system, m, device, resources, settings)
    predicted = p["layers"]
    out = {"system": system, "predicted_layers": predicted,
           "predicted_parameters": p["parameters"], "bound": p["bound"],
           "bound_bytes": p["bound_bytes"], "available": p["available"], "need": p["need"],
           "probes": [], "confirmed_layers": None, "confirmed_parameters": None,
           "first_not_fitting_layers": None}
    where = (f"{p['bound']}: {budget.fmt(p['bound_bytes'])} needed one layer more, "
             f"{budget.fmt(p['available'])} available" if p["bound_bytes"] is not None
             else p["bound"])
    say(f"  largest {system}: predicted {predicted} layers "
        f"({p['parameters']:,} parameters), bound by {where}")

    def run(role, layers):
        left = until - time.monotonic()
        limit = min(probe_limit_s, left)
        if limit < MIN_PROBE_S:
            r = {"status": "skipped", "skipped": f"not started: {max(left, 0):.0f} s left of the "
                                                 f"search's {budget_s:.0f} s"}
        else:
            started = time.monotonic()
            try:
                r = probe(system, layers, limit) or {}
            except Exception as e:  # noqa: BLE001 - the probe's fault is a result, not a crash
                r = {"status": "failed", "error": f"the probe raised {type(e).__name__}: {e}"}
            r.setdefault("seconds", time.monotonic() - started)
        status = r.get("status") or "failed"
        point = {"role": role, "layers": layers, "parameters": m.with_layers(layers).parameters(),
                 "status": status, "why": _short(r.get("error") or r.get("skipped")),
                 "seconds": round(float(r.get("seconds") or 0.0), 2)}
        for key in ("gpu_peak_bytes", "rss_peak_bytes", "cpu_tier_peak_bytes", "nvme_peak_bytes",
                    "pinned_bytes", "torch_max_allocated_bytes", "tokens_per_s"):
            if r.get(key) is not None:
                point[key] = r[key]
        out["probes"].append(point)
        say(f"  largest {system}: {role} probe, {layers} layers ({point['parameters']:,} "
            f"parameters): {status}" + (f" ({point['why']})" if point["why"] else "")
            + f", {point['seconds']} s")
        if status == "ok":
            if out["confirmed_layers"] is None or layers > out["confirmed_layers"]:
                out["confirmed_layers"], out["confirmed_parameters"] = layers, point["parameters"]
        elif status == "oom":
            if out["first_not_fitting_layers"] is None or layers < out["first_not_fitting_layers"]:
                out["first_not_fitting_layers"] = layers
        return status

    if predicted == 0:  # nothing fits: one layer should not fit either
        status = run("one", 1)
        verdict = {"oom": "nothing fits", "ok": "prediction too low"}.get(
            status, "failed" if status == "failed" else "inconclusive")
    else:
        status = run("prediction", predicted)
        if status == "ok":
            if p["bound"] == "max_layers":
                verdict = "max_layers"
            else:
                above = run("above", layers_above(m, predicted))
                verdict = {"oom": "confirmed", "ok": "prediction too low"}.get(
                    above, "failed" if above == "failed" else "inconclusive")
        elif status == "oom":
            verdict = "prediction too high"
            lower = layers_below(m, predicted)
            if lower:
                run("below", lower)
        else:
            verdict = "failed" if status == "failed" else "inconclusive"
    out["verdict"] = verdict
    out["verdict_means"] = VERDICTS[verdict]
    out["prediction_wrong"] = verdict in ("prediction too high", "prediction too low")
    confirmed = (f"{out['confirmed_layers']} layers trained" if out["confirmed_layers"]
                 else "no probe trained")
    failing = (f", {out['first_not_fitting_layers']} did not fit"
               if out["first_not_fitting_layers"] else "")
    out["message"] = (f"{system}: predicted {predicted} layers ({p['parameters']:,} parameters, "
                      f"bound by {p['bound']}); {confirmed}{failing}: {verdict}")
    say(f"  largest {out['message']}")
    return out
