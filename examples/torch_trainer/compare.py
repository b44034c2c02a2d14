#!/usr/bin/env python3
"""compare: gpt.py's GPT trained on the same batches, on one device, by five systems, each in
its own process (compare_worker.py), and each system's largest GPT on this machine:

  strata-cpu       strata.torch.zero_shard, ZeRO stage 3, parameter shards and fp32 masters and
                   Adam moments in strata's pinned CPU tier (ZeRO-Offload's placement), units =
                   blocks
  strata-nvme      the same with shards and states on NVMe (--nvme-path or STRATA_NVME_PATHS):
                   ZeRO-Infinity's placement
  fsdp2            PyTorch FSDP2: fully_shard per block and at the root with CPUOffloadPolicy and
                   torch's fused CPU AdamW, a process group of one (needs torch >= 2.4 and a GPU)
  fsdp2-nooffload  fully_shard without offload and fused CUDA AdamW: the compute-only reference,
                   and what a user with enough GPU memory runs
  torch            plain PyTorch: the model and AdamW on the device (fused on a GPU)

A run is phases, each timed and reported (the summary's "phases" line):
  smoke       compare_smoke.py, seconds long: a tiny GPT through strata on the GPU with NCCL and
              with Gloo against torch, the engine's stream-ordered path and NCCL's [cuda] cases.
              A failure stops the run with a short diagnosis.
  data        the batches, built once here (compare_data.py) and handed to every worker.
  comparison  each system at the comparison's size, after its memory budget was checked against
              the machine (compare_budget.py: a budget that does not fit is "refused", naming the
              resource), within 70% of the deadline, each system its estimated time plus the
              others' slack (compare_time.py). Any strata result but "ok" fails the run, its
              error in the table.
  search      each system's largest model, predicted from the bytes it needs in each place and
              what the machine offers, then confirmed by one-step probes at the prediction and
              25% above (compare_search.py).
  report      the table, the agreement, the JSON, the SVG and --summary (gpu-check's).

Every system uses AdamW (peak lr 3e-3 after a linear warm-up, betas 0.9/0.95, weight decay 0.1),
clips the gradient norm at 1.0, starts from gpt.init_parameter's values and trains on the same
batches. On a GPU the model computes in bf16 (strata and FSDP2: bf16 parameters and gradients,
fp32 masters; plain torch: fp32 parameters under bf16 autocast): strata is held to FSDP2 (the
same bf16 policy) within --tolerance, torch is informative, held to a looser bound without
failing the run (compare_agreement.py); on the CPU everything is fp32 and torch is the
reference.

    PYTHONPATH=build/python STRATA_BACKEND=cuda python3 examples/torch_trainer/compare.py \\
        --json=compare.json --svg=compare.svg --summary=compare.txt   # tools/gpu-check.sh
    PYTHONPATH=build/python STRATA_BACKEND=host /usr/bin/python3 \\
        examples/torch_trainer/compare.py --device=cpu               # seconds, tiny sizes

Exit: 0 PASS; 1 FAIL (the smoke stage failed, a strata system did not train, a binding
disagreement, a system failed otherwise, strata's memory model contradicted by its probe, or
none trained); 2 usage; 77 no torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_agreement  # noqa: E402  (none of these imports torch)
import compare_budget as budget  # noqa: E402
import compare_report  # noqa: E402
import compare_search  # noqa: E402
import compare_time  # noqa: E402
from compare_runner import LAUNCH_VARIABLES, MIN_TRY_S, Runner  # noqa: E402

SYSTEMS = ("fsdp2-nooffload", "fsdp2", "strata-cpu", "strata-nvme", "torch")
DEFAULTS = {
    "cuda": dict(vocab=32768, seq_len=1024, d_model=2048, heads=16, layers=8, batch=8, steps=5,
                 warmup=2, deadline_s=300.0, search_max_layers=4096, gpu_bytes="6GiB",
                 max_live_bytes="2GiB", prefetch_bytes="256MiB"),
    "cpu": dict(vocab=64, seq_len=64, d_model=64, heads=4, layers=2, batch=8, steps=4, warmup=1,
                deadline_s=120.0, search_max_layers=64, gpu_bytes="64MiB",
                max_live_bytes="1MiB", prefetch_bytes="64KiB"),
}
# (bound for strata against the reference, torch's informative bound, why).
TOLERANCE = {
    "cuda": (3e-2, 5e-2, "bf16 (unit roundoff 2^-9 ~ 2e-3): strata and FSDP2 keep bf16 "
                         "parameters and fp32 masters but sum in other orders, so the losses "
                         "drift apart by a few roundoffs over the steps; a fault (a wrong "
                         "gradient, a stale parameter) moves them by far more. Not yet "
                         "measured on a GPU: the run reports fsdp2 against fsdp2-nooffload "
                         "(the spread of bf16 training itself) beside it"),
    "cpu": (1e-5, 1e-5, "fp32: the same arithmetic but for the order of the AdamW and gradient "
                        "sums (strata's CPU kernel against torch's AdamW): measured ~1e-7, issue "
                        "15's rule for fp32 is 1e-6 per step, 1e-5 leaves room"),
}
COMPARISON_SHARE = 0.7  # of the deadline, until the comparison's last system ends
SMOKE_START_S = 25.0  # the smoke process's own start (python, torch, CUDA) beyond its checks


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated, of {', '.join(SYSTEMS)} (default all)")
    for name in ("vocab", "seq-len", "d-model", "heads", "layers", "batch", "steps", "warmup"):
        p.add_argument(f"--{name}", type=int, help="default: by device (see DEFAULTS)")
    p.add_argument("--tolerance", type=float, help="relative loss difference allowed per step "
                   "between strata and the reference (default 3e-2 on a GPU: bf16; 1e-5 on the "
                   "CPU: fp32)")
    p.add_argument("--nvme-path", default=os.environ.get("STRATA_NVME_PATHS", "").split(",")[0],
                   help="a directory on NVMe for strata-nvme (default: STRATA_NVME_PATHS)")
    p.add_argument("--deadline-s", type=float,
                   help="the whole run's limit (default 300 on a GPU, 120 on the CPU)")
    p.add_argument("--resources", default="",
                   help="what the machine offers, over what is measured: gpu=, host=, pinned=, "
                        "nvme= sizes (e.g. pinned=64MiB); the budgets and the search use them")
    p.add_argument("--no-smoke", action="store_true", help="skip the smoke stage")
    p.add_argument("--smoke-s", type=float, default=20.0, help="the smoke stage's limit (20)")
    p.add_argument("--no-search", action="store_true", help="skip the largest-model search")
    p.add_argument("--search-batch", type=int, default=1,
                   help="sequences in a probe's step (default 1: the model's states, not its "
                        "activations, should decide what fits)")
    p.add_argument("--search-max-layers", type=int, help="the prediction's largest layer count")
    p.add_argument("--probe-s", type=float, default=30.0, help="one probe's limit (30 s)")
    p.add_argument("--strata-gpu-bytes", help="strata's GPU arena (default 6GiB; CPU: 64MiB)")
    p.add_argument("--json", help="write everything measured to this file")
    p.add_argument("--svg", help="write the plot of tokens/s against model size to this file")
    p.add_argument("--summary", help="write the summary (phases, smoke, table, agreement, "
                                     "largest models, verdict) to this file: gpu-check's")
    p.add_argument("--perturb", choices=SYSTEMS, help=argparse.SUPPRESS)  # tests: a disagreement
    p.add_argument("--smoke-fail", help=argparse.SUPPRESS)  # tests: a smoke check that fails
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in SYSTEMS:
            p.error(f"--systems: '{s}' is not one of {', '.join(SYSTEMS)}")
    for name in ("vocab", "seq_len", "d_model", "heads", "layers", "batch", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup is not None and args.warmup < 0:
        p.error("--warmup must be at least 0")
    for name in ("deadline_s", "tolerance", "smoke_s", "probe_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.search_batch < 1:
        p.error("--search-batch must be at least 1")
    try:
        budget.Resources.parse(args.resources) if args.resources else None
    except ValueError as e:
        p.error(f"--resources={args.resources}: {e}")
    return args


def resolve(args) -> None:
    """Device-dependent defaults (torch is imported here, after the usage checks)."""
    if args.device == "auto":
        try:
            import torch
            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            args.device = "cpu"
    d = DEFAULTS[args.device]
    for key in ("vocab", "seq_len", "d_model", "heads", "layers", "batch", "steps", "warmup",
                "deadline_s", "search_max_layers"):
        if getattr(args, key) is None:
            setattr(args, key, d[key])
    if args.d_model % args.heads:
        raise SystemExit(f"compare: --d-model={args.d_model} does not divide into "
                         f"--heads={args.heads}")
    if args.warmup >= args.steps:
        raise SystemExit(f"compare: --warmup={args.warmup} leaves no timed step of --steps="
                         f"{args.steps}")
    args.strata_gpu_bytes = args.strata_gpu_bytes or d["gpu_bytes"]
    args.max_live_bytes, args.prefetch_bytes = d["max_live_bytes"], d["prefetch_bytes"]
    if args.tolerance is None:
        args.tolerance = TOLERANCE[args.device][0]


class Phases:
    """The run's phases and their seconds."""

    def __init__(self):
        self.start = time.monotonic()
        self.done = []
        self.name, self.t0 = None, None

    def begin(self, name):
        self.end()
        self.name, self.t0 = name, time.monotonic()

    def end(self):
        if self.name is not None:
            self.done.append((self.name, round(time.monotonic() - self.t0, 1)))
            self.name = None

    def line(self, deadline) -> str:
        total = time.monotonic() - self.start
        return ("phases: " + ", ".join(f"{n} {s:.1f} s" for n, s in self.done)
                + f" (total {total:.0f} s of the {deadline:.0f} s deadline)")


def smoke(args, work, say) -> dict:
    """compare_smoke.py in its own process, bounded; its JSON (or why there is none)."""
    out = os.path.join(work, "smoke.json")
    cmd = [sys.executable, os.path.join(HERE, "compare_smoke.py"), f"--device={args.device}",
           f"--json={out}", f"--limit-s={args.smoke_s}"]
    if args.smoke_fail:
        cmd.append(f"--fail={args.smoke_fail}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (HERE, os.environ.get("PYTHONPATH")) if p))
    for name in LAUNCH_VARIABLES:  # a job of one rank, also under torchrun or srun
        env.pop(name, None)
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=args.smoke_s + SMOKE_START_S)
        output = proc.stdout
    except subprocess.TimeoutExpired as e:
        output = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout
                                                                                        or "")
    for line in output.splitlines():
        if line.startswith("smoke: "):
            say(line)
    try:
        with open(out) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"ok": False, "checks": [], "diagnosis": "the smoke stage wrote no result within "
                f"{args.smoke_s + SMOKE_START_S:.0f} s: {output.strip()[-300:]}"}


def summarize(r: dict, warmup: int) -> dict:
    """Medians over the timed steps (after warmup)."""
    timed = r["steps"][warmup:] or r["steps"]
    med = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    r["step_s"] = med("seconds")
    for key in ("forward_s", "backward_s", "optimizer_s"):
        r[key] = med(key)
    r["exposed_transfer_s"] = (med("exposed_transfer_s")
                               if timed[0].get("exposed_transfer_s") is not None else None)
    r["tokens_per_s"] = r["tokens_per_step"] / r["step_s"]
    r["losses"] = [s["loss"] for s in r["steps"]]
    return r


def finite(value):
    """The JSON's numbers stay numbers: NaN and infinities become null (RFC 8259)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed (Debian: apt install python3-torch)", flush=True)
        return 77
    resolve(args)
    lines = []  # the summary

    def say(*a, **k):
        print(*a, **k, flush=True)

    tolerance, torch_tolerance, tolerance_reason = TOLERANCE[args.device]
    if args.tolerance != tolerance:
        tolerance, tolerance_reason = args.tolerance, "--tolerance"
    model = budget.Model.of(args)
    say(f"compare: GPT of {args.layers} blocks, d_model {args.d_model}, {args.heads} heads, vocab "
        f"{args.vocab}, seq {args.seq_len}, untied head: {model.parameters():,} parameters; "
        f"batch {args.batch} ({args.batch * args.seq_len} tokens a step), {args.steps} steps "
        f"({args.warmup} warm-up); device {args.device}; torch {torch.__version__}; deadline "
        f"{args.deadline_s:.0f} s; tolerance {tolerance:g} relative")
    work = tempfile.mkdtemp(prefix="strata-compare-")
    phases = Phases()
    report = {"tool": "strata-gpt-compare", "device": args.device, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
              "model": {"vocab": args.vocab, "seq_len": args.seq_len, "d_model": args.d_model,
                        "heads": args.heads, "layers": args.layers, "tied": False,
                        "parameters": model.parameters()},
              "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
              "tolerance": tolerance, "torch_tolerance": torch_tolerance,
              "tolerance_reason": tolerance_reason, "tolerance_measured": args.device == "cpu",
              "deadline_s": args.deadline_s, "systems": {}, "search": {}, "skipped": [],
              "failures": []}
    failures = report["failures"]

    # ---- smoke ----
    if not args.no_smoke:
        phases.begin("smoke")
        result = smoke(args, work, say)
        report["smoke"] = result
        checks = "; ".join(f"{c['name']} {c['status']} {c['seconds']} s"
                           for c in result.get("checks", []))
        lines.append(f"smoke: {'ok' if result.get('ok') else 'FAIL'} ({checks})")
        if not result.get("ok"):
            failures.append(f"smoke stage: {result.get('diagnosis')}")
            lines.append(f"smoke diagnosis: {result.get('diagnosis')}")
            return finish(args, report, phases, lines, work, say, stopped=True)

    # ---- resources and data ----
    phases.begin("data")
    resources = budget.Resources.measure(args.device, args.nvme_path or None)
    if args.resources:
        resources = budget.Resources.parse(args.resources, base=resources, device=args.device,
                                           nvme_path=args.nvme_path or None)
    report["resources"] = resources.as_dict()
    say(f"resources: {resources.describe()}")
    import compare_data
    import gpt
    data = os.path.join(work, "batches.pt")
    c = gpt.GPTConfig(vocab=args.vocab, seq_len=args.seq_len, d_model=args.d_model,
                      heads=args.heads, layers=args.layers, tied=False)
    meta = compare_data.write_data(data, c, args.steps, args.batch)
    report["data"] = {k: meta[k] for k in ("digest", "steps", "batch", "seed")}

    # ---- the comparison ----
    phases.begin("comparison")
    settings = budget.Settings.of(args, args.device)
    probe_settings = budget.Settings.of(args, args.device, batch=args.search_batch)

    def sizing(check_first, s):
        def size(system, layers):
            m = model.with_layers(layers)
            if system.startswith("fsdp2") and args.device != "cuda":
                return {}, None  # the worker says why it does not run here (a skip)
            try:
                if check_first:
                    why = budget.check(system, m, args.device, resources, s)
                    if why:
                        return None, why
                if system.startswith("strata"):
                    return budget.strata_env(system, m, args.device, resources, s), None
            except ValueError:  # a system that does not run here: the worker says why
                pass
            return {}, None
        return size

    runner = Runner(args, work, sizing(True, settings), data=data, start=phases.start)
    prober = Runner(args, work, sizing(False, probe_settings), start=phases.start)
    systems = report["systems"]
    # The comparison gets 70% of the run and the search the rest; within it each system its
    # estimated time plus the others' slack (compare_time.py: strata-nvme's disk-bound step).
    compare_until = COMPARISON_SHARE * args.deadline_s
    # The cheaper first: the costliest (strata-nvme on a GPU) runs last and gets whatever
    # the others left unused.
    expected = {system: compare_time.expected_s(system, model, args.device, args.steps,
                                                settings) for system in args.systems}
    order = sorted(args.systems, key=expected.get)
    estimates = [expected[system] for system in order]
    report["comparison_estimates_s"] = expected
    report["comparison_order"] = order
    for i, system in enumerate(order):
        limit = compare_time.limit_s(compare_until - (time.monotonic() - phases.start),
                                     estimates[i:])
        r = runner.run(system, args.layers, args.steps, max(limit, MIN_TRY_S + 2), args.batch)
        r["limit_s"] = round(max(limit, MIN_TRY_S + 2), 1)
        r["system"] = system
        if r.get("status") == "ok":
            summarize(r, args.warmup)
            say(f"{system}: trained, {r['tokens_per_s']:.0f} tokens/s, losses "
                + " ".join(f"{x:.6f}" if x is not None else "nan" for x in r["losses"]))
        elif r.get("status") == "skipped":
            # Lower case: gpu-check records a step whose output says "SKIPPED:" as skipped
            # whole, and one skipped system does not make the comparison a skip.
            say(f"skipped: {system}: {r['skipped']}")
            report["skipped"].append({"system": system, "why": r["skipped"]})
        else:
            say(f"{system}: {r.get('status')}: {r.get('error')}")
            if r.get("output_tail"):
                say("  " + r["output_tail"].strip().replace("\n", "\n  "))
        for note in r.get("notes", []):
            say(f"  {system}: {note}")
        if system.startswith("strata") and r.get("status") != "ok":
            failures.append(f"{system} at the comparison's size: {r.get('status')}: "
                            f"{r.get('error') or r.get('skipped')}")
        elif r.get("status") == "failed":
            failures.append(f"{system} failed: {r.get('error')}")
        systems[system] = r
    report["systems"] = systems = {s: systems[s] for s in args.systems}  # the table's order
    # What waiting for transfers adds: forward+backward against the compute-only reference.
    ref = systems.get("fsdp2-nooffload", {})
    for r in systems.values():
        if r.get("status") == "ok" and ref.get("status") == "ok":
            r["exposed_s"] = (r["forward_s"] + r["backward_s"]
                              - ref["forward_s"] - ref["backward_s"])

    # ---- agreement ----
    trained = {s: r["losses"] for s, r in systems.items() if r.get("status") == "ok"}
    verdict = compare_agreement.agree(trained, args.device, tolerance, torch_tolerance)
    report["agreement"] = verdict
    if len(trained) > 1:
        for row in verdict["rows"]:
            at = f" at step {row['step']}" if row["step"] else " (bitwise equal)"
            say(f"losses of {row['system']} against {verdict['reference']}: largest relative "
                f"difference {row['worst']:.3g}{at} (bound {row['bound']}"
                f"{'' if row['binding'] else ', informative'})"
                + ("" if row["ok"] else f"  <-- {row.get('why')}"))
        if verdict["fsdp2_spread"] is not None:
            say(f"fsdp2 against fsdp2-nooffload (the noise of bf16 training): "
                f"{verdict['fsdp2_spread']:.3g}")
        say(f"{'step':>4}  " + "  ".join(f"{s:>15}" for s in trained))
        for step in range(args.steps):
            say(f"{step + 1:4d}  " + "  ".join(
                f"{v[step]:15.6f}" if step < len(v) and v[step] is not None else f"{'-':>15}"
                for v in trained.values()))
    for f in verdict["failures"]:
        failures.append(f"DISAGREE: {f['system']} {f.get('why')} (reference "
                        f"{verdict['reference']})")

    # ---- the largest models ----
    phases.begin("search")
    found = report["search"]
    searchable = [s for s in args.systems if systems[s].get("status") != "skipped"]
    if args.no_search:
        say("search: skipped (--no-search)")
    for i, system in enumerate([] if args.no_search else searchable):
        left = args.deadline_s - (time.monotonic() - phases.start) - 5
        budget_s = left / (len(searchable) - i)

        def probe(name, layers, limit_s):
            r = prober.run(name, layers, 1, limit_s, args.search_batch, extra=("--probe",),
                           data=False)
            if r.get("status") == "ok" and r.get("steps"):  # its one step, warm-up included
                r["tokens_per_s"] = r["tokens_per_step"] / r["steps"][-1]["seconds"]
            return r
        found[system] = compare_search.largest(system, args, args.device, resources,
                                               probe_settings, probe, max(budget_s, 0.0), say,
                                               probe_limit_s=args.probe_s)
        if system.startswith("strata") and found[system]["verdict"] == "prediction too high":
            failures.append(f"largest {system}: the prediction did not fit: "
                            f"{found[system]['message']} (compare_budget.py's model is wrong)")
    return finish(args, report, phases, lines, work, say)


def finish(args, report, phases, lines, work, say, stopped=False) -> int:
    """The table, the summary, the JSON and the SVG; the exit status."""
    phases.begin("report")
    systems, found, failures = report["systems"], report["search"], report["failures"]
    if not stopped and not any(r.get("status") == "ok" for r in systems.values()):
        failures.append("no system trained")
    table = compare_report.table(systems, found) if systems else ""
    if table:
        say("")
        say(table)
        say(f"({compare_report.LEGEND})")
    for s in report["skipped"]:
        say(f"skipped: {s['system']}: {s['why']}")
    started = compare_report.startup(systems)
    if started:
        say(started)
    agreement = report.get("agreement")
    summary = list(lines)
    if table:
        summary += [table, f"({compare_report.LEGEND})"]
    if started:
        summary.append(started)
    if agreement and agreement.get("rows"):
        summary.append(f"agreement (reference {agreement['reference']}): " + "; ".join(
            f"{r['system']} {r['worst']:.2g} (bound {r['bound']}"
            f"{'' if r['binding'] else ', informative'}){'' if r['ok'] else ' OUTSIDE'}"
            for r in agreement["rows"]) + (f"; fsdp2 vs fsdp2-nooffload spread "
                                          f"{agreement['fsdp2_spread']:.2g}"
                                          if agreement.get("fsdp2_spread") is not None else ""))
    for f in found.values():
        summary.append(f"largest {f['message']}")
    # The plot: each system's probes that trained (lines, at --search-batch) and its comparison
    # run (a square, at --batch).
    series, marks = {}, {}
    for system, r in systems.items():
        if r.get("status") == "ok":
            marks[system] = (r["parameters"], r["tokens_per_s"])
        series[system] = sorted(
            (p["parameters"], r2) for p in found.get(system, {}).get("probes", [])
            if p["status"] == "ok" and (r2 := p.get("tokens_per_s")) is not None)
    if args.svg:
        title = (f"GPT tokens/s against size, {args.device}, d_model {args.d_model}, seq "
                 f"{args.seq_len}")
        with open(args.svg, "w") as f:
            f.write(compare_report.svg(series, title, marks, "squares: the comparison (batch "
                                       f"{args.batch}); lines: the search's probes"))
    report["plot"] = {s: {"comparison": ({"parameters": marks[s][0], "tokens_per_s": marks[s][1]}
                                         if s in marks else None),
                          "search": [{"parameters": n, "tokens_per_s": t}
                                     for n, t in series.get(s, [])]}
                      for s in systems}
    report["passed"] = not failures
    phases.end()
    report["phases"] = dict(phases.done)
    report["elapsed_s"] = round(time.monotonic() - phases.start, 2)
    summary.insert(0, phases.line(args.deadline_s))
    summary.append(("PASS" if not failures else "FAIL: " + " | ".join(failures))[:2000])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(finite(report), f, indent=1, allow_nan=False)
    if args.summary:
        with open(args.summary, "w") as f:
            f.write("\n".join(summary) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    say(summary[0])
    for f in failures:
        say(f)
    say("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
