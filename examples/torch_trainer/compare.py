#!/usr/bin/env python3
"""compare: gpt.py's GPT trained on the same batches, on one device, by four systems, each in
its own process (compare_worker.py), and per system the largest GPT that trains at all:

  strata-cpu   strata.torch.zero_shard, ZeRO stage 3, parameter shards and fp32 masters and
               Adam moments in strata's CPU tier (ZeRO-Offload's placement), units = blocks
  strata-nvme  the same with shards and states on NVMe (--nvme-path or STRATA_NVME_PATHS; skipped,
               saying so, without one): ZeRO-Infinity's placement
  fsdp2        PyTorch FSDP2: fully_shard per block and at the root with CPUOffloadPolicy and
               torch's fused CPU AdamW, in a process group of one rank (gloo for CPU tensors,
               NCCL for CUDA ones, a FileStore rendezvous); needs torch >= 2.4 and a GPU
  torch        plain PyTorch: the model and AdamW on the device (fused on a GPU), where it fits

On a GPU the model computes in bf16 (strata and FSDP2: bf16 parameters and gradients, fp32
masters; plain torch: fp32 parameters under bf16 autocast); on the CPU in fp32. Every system
uses AdamW (lr 3e-3, betas 0.9/0.95, weight decay 0.1), clips the gradient norm at 1.0, starts
from gpt.init_parameter's values and trains on gpt.synthetic_batch(step)'s batches, so the
losses must agree step by step within --tolerance (relative): a disagreement fails the run (exit
1), naming the system, the step and both values.

Per system (medians over the steps after --warmup): tokens/s, the step's time and its parts
(forward, backward, optimizer; on a GPU from CUDA events on torch's stream, the step ending at
torch.cuda.synchronize; on the CPU the host clock) and strata's exposed transfers (the time the
host waited for parameter gathers, NVMe reads included: engine stats' fetch_wait_ns); peak GPU
memory (torch.cuda.max_memory_allocated plus the peak of strata's arena, allocated outside
torch's allocator), host RSS (VmHWM), pinned host bytes (strata's CPU tier on CUDA; torch's
where torch.cuda.host_memory_stats exists). Then the largest model: the layer count doubled from
the comparison's, then bisected, each try a process of --search-steps steps bounded in time; an
out-of-memory (torch's, strata's ResourceExhaustedError, a killed process) is "does not fit".
The whole run stays within --deadline-s: what would not fit in the time left is skipped, and
the log says so.

    PYTHONPATH=build/python STRATA_BACKEND=cuda python3 examples/torch_trainer/compare.py \\
        --json=compare.json --svg=compare.svg                        # tools/gpu-check.sh
    PYTHONPATH=build/python STRATA_BACKEND=host /usr/bin/python3 \\
        examples/torch_trainer/compare.py --device=cpu               # seconds, tiny sizes

Exit: 0 PASS (the systems that ran agree; a system that does not fit, runs out of time or is
unavailable here is reported, not failed); 1 FAIL (a disagreement, a system that failed
otherwise, or none trained); 2 usage; 77 no torch.
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

import compare_report  # noqa: E402  (no torch)

SYSTEMS = ("strata-cpu", "strata-nvme", "fsdp2", "torch")
# (vocab, seq_len, d_model, heads, layers, batch, steps, warmup, deadline) by device.
DEFAULTS = {
    "cuda": dict(vocab=32768, seq_len=1024, d_model=2048, heads=16, layers=8, batch=8, steps=6,
                 warmup=2, deadline_s=300.0, search_max_layers=256, gpu_bytes="6GiB",
                 max_live_bytes="2GiB", prefetch_bytes="256MiB"),
    "cpu": dict(vocab=64, seq_len=64, d_model=64, heads=4, layers=2, batch=8, steps=4, warmup=1,
                deadline_s=120.0, search_max_layers=8, gpu_bytes="64MiB",
                max_live_bytes="1MiB", prefetch_bytes="64KiB"),
}
# Relative loss tolerance and why (docs/bench.md repeats it).
TOLERANCE = {
    "cuda": (3e-2, "bf16: 8 significant bits (unit roundoff 2^-9 ~ 2e-3); the parameters are "
                   "rounded to bf16 every step and the systems sum in other orders (FSDP2 and "
                   "strata in bf16 parameters, torch in fp32 under autocast), so the losses "
                   "drift apart by a few roundoffs over the steps; a real fault (a wrong "
                   "gradient, a stale parameter) moves them by far more"),
    "cpu": (1e-5, "fp32: the same arithmetic but for the order of the AdamW and gradient sums "
                  "(strata's CPU kernel against torch's AdamW): measured ~1e-7, issue 15's rule "
                  "for fp32 is 1e-6 per step, 1e-5 leaves room for longer runs"),
}
MIN_TRY_S = 5.0  # a process given less time than this is not started
BYTES_PER_PARAM = 20  # strata stage 3 at one rank: fp32 master, two moments, shard, gradient


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated, of {', '.join(SYSTEMS)} (default all)")
    for name in ("vocab", "seq-len", "d-model", "heads", "layers", "batch", "steps", "warmup"):
        p.add_argument(f"--{name}", type=int, help="default: by device (see DEFAULTS)")
    p.add_argument("--tolerance", type=float, help="relative loss difference allowed per step "
                   "(default 3e-2 on a GPU: bf16; 1e-5 on the CPU: fp32)")
    p.add_argument("--nvme-path", default=os.environ.get("STRATA_NVME_PATHS", "").split(",")[0],
                   help="a directory on NVMe for strata-nvme (default: STRATA_NVME_PATHS)")
    p.add_argument("--deadline-s", type=float,
                   help="the whole run's limit (default 300 on a GPU, 120 on the CPU)")
    p.add_argument("--no-search", action="store_true", help="skip the largest-model search")
    p.add_argument("--search-steps", type=int, default=2)
    p.add_argument("--search-batch", type=int, default=1,
                   help="sequences a step in the search (default 1: the model's states, not "
                        "its activations, should decide what fits)")
    p.add_argument("--search-max-layers", type=int)
    p.add_argument("--search-try-s", type=float, default=90.0,
                   help="one search try's limit in seconds (default 90)")
    p.add_argument("--strata-cpu-bytes", help="strata-cpu's CPU tier (default: sized to the "
                   f"model, {BYTES_PER_PARAM} bytes a parameter and 256 MiB, within the host's "
                   "memory)")
    p.add_argument("--strata-gpu-bytes", help="strata's GPU arena (default 6GiB; CPU: 64MiB)")
    p.add_argument("--json", help="write everything measured to this file")
    p.add_argument("--svg", help="write the plot of tokens/s against model size to this file")
    p.add_argument("--perturb", choices=SYSTEMS, help=argparse.SUPPRESS)  # tests: a disagreement
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
    for name in ("deadline_s", "tolerance"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    for name in ("search_steps", "search_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
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


def parameters(args, layers: int) -> int:
    d, m = args.d_model, 4 * args.d_model
    return ((args.vocab + args.seq_len) * d + layers * (4 * d * d + 2 * d * m + 9 * d + m)
            + 2 * d + args.vocab * d)  # untied head (gpt.parameter_count)


def mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


class Runner:
    """Runs compare_worker.py processes within the whole run's deadline."""

    def __init__(self, args, work: str):
        self.args, self.work = args, work
        self.start = time.monotonic()
        self.n = 0

    def left(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.start)

    def env(self, system: str, layers: int):
        """The worker's environment, or (None, why) when the model cannot fit the host's memory
        or the NVMe directory (no process is started for it)."""
        env = dict(os.environ)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)  # a job of one rank
        env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
        if not system.startswith("strata"):
            return env, None
        n = parameters(self.args, layers)
        need = BYTES_PER_PARAM * n + (256 << 20)
        env["STRATA_GPU_BYTES"] = str(self.args.strata_gpu_bytes)
        if system == "strata-cpu":
            env.pop("STRATA_NVME_PATHS", None)
            if self.args.strata_cpu_bytes:
                env["STRATA_CPU_BYTES"] = self.args.strata_cpu_bytes
            elif need > 0.8 * mem_available():
                return None, (f"needs ~{need / 2**30:.1f} GiB of CPU tier, more than 80% of "
                              f"the host's available {mem_available() / 2**30:.1f} GiB")
            else:
                env["STRATA_CPU_BYTES"] = str(need)
        else:
            path = self.args.nvme_path
            env["STRATA_NVME_PATHS"] = path
            free = shutil.disk_usage(path).free
            if need > 0.9 * free:
                return None, (f"needs ~{need / 2**30:.1f} GiB on NVMe, more than 90% of "
                              f"{path}'s free {free / 2**30:.1f} GiB")
            env["STRATA_NVME_BYTES"] = str(need)
            # NVMe's bounce buffers (the default 256 MiB on a GPU), and a CPU tier of them and
            # the fp32 model's size more (the gathers' and the optimizer's chunks in flight;
            # generous, so that "does not fit" is the drive's or the GPU's, not this sizing).
            staging = 256 << 20 if self.args.device == "cuda" else 8 << 20
            env.setdefault("STRATA_STAGING_BYTES", str(staging))
            env["STRATA_CPU_BYTES"] = str(int(env["STRATA_STAGING_BYTES"])
                                          + max(64 << 20, 4 * n))
        return env, None

    def run(self, system: str, layers: int, steps: int, limit: float, batch: int) -> dict:
        """One worker process; its JSON, with "status" ok / oom / failed / skipped / timeout."""
        limit = min(limit, self.left() - 2)
        if limit < MIN_TRY_S:
            return {"status": "skipped",
                    "skipped": f"not started: {max(self.left(), 0):.0f} s left before the "
                               f"{self.args.deadline_s:.0f} s deadline"}
        env, why = self.env(system, layers)
        if env is None:
            return {"status": "oom", "fits": False, "error": why, "not_started": True}
        self.n += 1
        out = os.path.join(self.work, f"{self.n}-{system}.json")
        a = self.args
        cmd = [sys.executable, os.path.join(HERE, "compare_worker.py"), f"--system={system}",
               f"--device={a.device}", f"--vocab={a.vocab}", f"--seq-len={a.seq_len}",
               f"--d-model={a.d_model}", f"--heads={a.heads}", f"--layers={layers}",
               f"--batch={batch}", f"--steps={steps}", f"--json={out}",
               f"--max-live-bytes={a.max_live_bytes}", f"--prefetch-bytes={a.prefetch_bytes}"]
        if a.perturb == system:
            cmd.append("--perturb")
        if a.device == "cuda":  # SDPA where torch has it: no t x t scores kept for backward
            cmd.append("--fused-attention")
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=limit)
            output, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as e:
            tail = (e.stdout or b"")[-600:]
            return {"status": "timeout", "error": f"did not finish within {limit:.0f} s",
                    "output_tail": tail.decode(errors="replace") if isinstance(tail, bytes)
                    else tail, "seconds": time.monotonic() - started}
        result = {}
        if os.path.exists(out):
            with open(out) as f:
                result = json.load(f)
        if not result:
            killed = rc < 0
            why = (f"killed by signal {-rc} without a result (host memory?)" if killed else
                   f"exited {rc} without a result: {output[-400:]}")
            result = {"status": "oom" if killed else "failed", "fits": not killed, "error": why}
        result["seconds"] = time.monotonic() - started
        if result.get("status") == "failed":
            result["output_tail"] = output[-1500:]
        return result


def summarize(r: dict, warmup: int) -> dict:
    """Medians over the timed steps (after warmup)."""
    timed = r["steps"][warmup:] or r["steps"]
    med = lambda key: statistics.median(s[key] for s in timed)  # noqa: E731
    r["step_s"] = med("seconds")
    for key in ("forward_s", "backward_s", "optimizer_s"):
        r[key] = med(key)
    r["exposed_transfer_s"] = (med("exposed_transfer_s")
                               if timed[0]["exposed_transfer_s"] is not None else None)
    r["tokens_per_s"] = r["tokens_per_step"] / r["step_s"]
    r["losses"] = [s["loss"] for s in r["steps"]]
    return r


def search(runner: Runner, system: str, start_layers: int, budget: float, say) -> dict:
    """The largest layer count (at the comparison's width) that trains: doubling from
    start_layers until a try does not fit, then bisection, within `budget` seconds."""
    a = runner.args
    until = time.monotonic() + budget
    tries, ok, bad, bound = [], start_layers if start_layers else 0, None, "max"

    def attempt(layers):
        nonlocal bound
        limit = min(a.search_try_s, until - time.monotonic())
        r = runner.run(system, layers, a.search_steps, limit, a.search_batch)
        status = r.get("status")
        point = {"layers": layers, "parameters": parameters(a, layers), "status": status,
                 "seconds": round(r.get("seconds", 0.0), 2)}
        if status == "ok":
            last = r["steps"][-1]
            point["tokens_per_s"] = r["tokens_per_step"] / last["seconds"]
            point["gpu_peak_bytes"] = r.get("gpu_peak_bytes")
            point["rss_peak_bytes"] = r.get("rss_peak_bytes")
        else:
            why = r.get("error") or r.get("skipped") or ""
            point["why"] = why if len(why) <= 200 else why[:197] + "..."
        tries.append(point)
        say(f"  search {system}: {layers} layers ({compare_report.count(point['parameters'])} "
            f"parameters): {status}" + (f" ({point['why']})" if point.get("why") else "")
            + f", {point['seconds']} s")
        if status in ("skipped", "timeout"):
            bound = "deadline"
            return None
        if status == "failed":
            bound = "failed"
            return None
        return status == "ok"

    layers = max(start_layers * 2, 1) if ok else 1
    while layers <= a.search_max_layers:
        fits = attempt(layers)
        if fits is None:
            break
        if not fits:
            bad, bound = layers, "oom"
            break
        ok = layers
        layers *= 2
    if bad is not None:  # bisection to within an eighth, at most 4 tries
        for _ in range(4):
            if bad - ok <= max(1, ok // 8):
                break
            mid = (ok + bad) // 2
            fits = attempt(mid)
            if fits is None:
                break
            if fits:
                ok = mid
            else:
                bad = mid
    return {"largest_layers": ok or None, "largest_parameters": parameters(a, ok) if ok else None,
            "first_not_fitting_layers": bad, "bound": bound, "tries": tries,
            "bound_means": {"oom": "the next size did not fit", "deadline": "time ran out",
                            "max": f"--search-max-layers={a.search_max_layers} reached",
                            "failed": "a try failed (not a fit question)"}[bound]}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed (Debian: apt install python3-torch)", flush=True)
        return 77
    resolve(args)

    def say(*a, **k):
        print(*a, **k, flush=True)

    tolerance_reason = TOLERANCE[args.device][1]
    say(f"compare: GPT of {args.layers} blocks, d_model {args.d_model}, {args.heads} heads, vocab "
        f"{args.vocab}, seq {args.seq_len}, untied head: "
        f"{parameters(args, args.layers):,} parameters; batch {args.batch} "
        f"({args.batch * args.seq_len} tokens a step), {args.steps} steps ({args.warmup} "
        f"warm-up); device {args.device}; torch {torch.__version__}; deadline "
        f"{args.deadline_s:.0f} s; tolerance {args.tolerance:g} relative "
        f"({'bf16' if args.device == 'cuda' else 'fp32'})")
    work = tempfile.mkdtemp(prefix="strata-compare-")
    runner = Runner(args, work)
    systems, skipped = {}, []
    # The comparison takes at most 55% of the deadline, the search what is left.
    compare_until = 0.55 * args.deadline_s
    for i, system in enumerate(args.systems):
        if system == "strata-nvme" and not args.nvme_path:
            r = {"status": "skipped", "skipped": "no NVMe directory: give --nvme-path or "
                                                 "STRATA_NVME_PATHS"}
        else:
            share = (compare_until - (time.monotonic() - runner.start)) / (len(args.systems) - i)
            r = runner.run(system, args.layers, args.steps, max(share, MIN_TRY_S + 2),
                           args.batch)
        r["system"] = system
        if r.get("status") == "ok":
            summarize(r, args.warmup)
            say(f"{system}: trained, {r['tokens_per_s']:.0f} tokens/s, losses "
                + " ".join(f"{x:.6f}" for x in r["losses"]))
        elif r.get("status") == "skipped":
            # Lower case: gpu-check records a step whose output says "SKIPPED:" as skipped
            # whole, and one skipped system does not make the comparison a skip.
            say(f"skipped: {system}: {r['skipped']}")
            skipped.append({"system": system, "why": r["skipped"]})
        else:
            say(f"{system}: {r.get('status')}: {r.get('error')}")
            if r.get("output_tail"):
                say("  " + r["output_tail"].strip().replace("\n", "\n  "))
        systems[system] = r

    # Agreement: every system against the first that trained, in the order torch, strata-cpu...
    ran = [s for s in ("torch", "strata-cpu", "strata-nvme", "fsdp2")
           if systems.get(s, {}).get("status") == "ok"]
    disagreements, worst = [], 0.0
    reference = ran[0] if ran else None
    for system in ran[1:]:
        for step, (a, b) in enumerate(zip(systems[system]["losses"],
                                           systems[reference]["losses"]), 1):
            rel = abs(a - b) / max(abs(b), 1e-12) if math.isfinite(a) else math.inf
            worst = max(worst, rel)
            if not rel <= args.tolerance:
                disagreements.append({"system": system, "step": step, "loss": a,
                                      "reference": reference, "reference_loss": b,
                                      "relative": rel})
    if len(ran) > 1:
        say(f"losses of {', '.join(ran[1:])} against {reference}: largest relative difference "
            f"{worst:.3g} (tolerance {args.tolerance:g})")
        say(f"{'step':>4}  " + "  ".join(f"{s:>11}" for s in ran))
        for step in range(args.steps):
            say(f"{step + 1:4d}  " + "  ".join(
                f"{systems[s]['losses'][step]:11.6f}" if step < len(systems[s]["losses"])
                else f"{'-':>11}" for s in ran))

    # The largest model per system, in the time left, shared evenly.
    found = {}
    searchable = [s for s in args.systems if systems[s].get("status") in ("ok", "oom")]
    if args.no_search:
        say("search: skipped (--no-search)")
    for i, system in enumerate(searchable if not args.no_search else []):
        budget = (runner.left() - 3) / (len(searchable) - i)
        if budget < MIN_TRY_S:
            why = f"{max(runner.left(), 0):.0f} s left before the deadline"
            say(f"skipped: search {system}: {why}")
            found[system] = {"bound": "deadline", "largest_parameters": None, "tries": [],
                             "bound_means": why}
            continue
        start = args.layers if systems[system]["status"] == "ok" else 0
        found[system] = search(runner, system, start, budget, say)

    say("")
    say(compare_report.table(systems, found))
    say("(medians of the timed steps; GPU MiB = torch.cuda.max_memory_allocated + strata's "
        "arena peak; xfer = host waits for strata's parameter gathers; largest = the search's "
        "largest model that trained, >= when time or --search-max-layers ended it)")
    for s in skipped:
        say(f"skipped: {s['system']}: {s['why']}")
    for d in disagreements:
        say(f"DISAGREE: {d['system']} step {d['step']}: loss {d['loss']:.7g} against "
            f"{d['reference']}'s {d['reference_loss']:.7g} (relative {d['relative']:.3g} > "
            f"tolerance {args.tolerance:g})")

    # The plot: each system's search tries (lines, at --search-batch) and its comparison run
    # (a square, at --batch).
    series, marks = {}, {}
    for system in args.systems:
        if systems[system].get("status") == "ok":
            marks[system] = (systems[system]["parameters"], systems[system]["tokens_per_s"])
        series[system] = sorted((t["parameters"], t["tokens_per_s"])
                                for t in found.get(system, {}).get("tries", [])
                                if t["status"] == "ok")
    title = f"GPT tokens/s against size, {args.device}, d_model {args.d_model}, seq {args.seq_len}"
    subtitle = (f"lines: the largest-model search (batch {args.search_batch}); squares: the "
                f"comparison (batch {args.batch})")
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(compare_report.svg(series, title, marks, subtitle))
    failed = [s for s in args.systems if systems[s].get("status") == "failed"]
    ok = bool(ran) and not disagreements and not failed
    report = {
        "tool": "strata-gpt-compare", "device": args.device, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "model": {"vocab": args.vocab, "seq_len": args.seq_len, "d_model": args.d_model,
                  "heads": args.heads, "layers": args.layers, "tied": False,
                  "parameters": parameters(args, args.layers)},
        "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
        "tolerance": args.tolerance, "tolerance_reason": tolerance_reason,
        "deadline_s": args.deadline_s, "elapsed_s": round(time.monotonic() - runner.start, 2),
        "systems": systems, "search": found, "skipped": skipped,
        "agreement": {"reference": reference, "compared": ran[1:], "worst_relative": worst,
                      "disagreements": disagreements, "ok": not disagreements},
        "search_batch": args.search_batch,
        "plot": {s: {"comparison": ({"parameters": marks[s][0], "tokens_per_s": marks[s][1]}
                                    if s in marks else None),
                     "search": [{"parameters": n, "tokens_per_s": t} for n, t in series[s]]}
                 for s in args.systems},
        "passed": ok,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    say(f"{report['elapsed_s']:.1f} s of the {args.deadline_s:.0f} s deadline")
    if not ran:
        say("no system trained")
    for s in failed:
        say(f"{s} failed: {systems[s].get('error')}")
    say("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
