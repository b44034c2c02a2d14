#!/usr/bin/env python3
"""activations_compare: one transformer trained three ways in one run, to compare what keeping
the saved activations off the GPU costs and buys:

  torch        plain PyTorch: autograd keeps every saved activation on the device;
  save_on_cpu  torch.autograd.graph.save_on_cpu(pin_memory=True): PyTorch's own offload, each
               saved tensor copied to pinned host memory and copied back when backward needs it;
  strata       strata.torch.offload_activations: saved tensors go to strata's CPU tier (or NVMe)
               and come back into strata's GPU arena ahead of their use, at most --window-bytes
               there at once.

Each mode starts from the same weights and trains on the same batches with torch.optim.AdamW, so
the only difference is where the activations wait. Per mode: the median step time over the timed
steps, and on CUDA the peak of torch.cuda.max_memory_allocated (torch's allocator) over them; for
strata also the peak GPU-arena bytes its activations held (strata's arena is allocated up front,
outside torch's allocator, so the two add up). The losses of every step and the final weights must
be bitwise equal across the modes on the CPU (the bytes are copied, never converted); on CUDA
they must agree within --tolerance (cuBLAS may pick other kernels when memory differs).

    PYTHONPATH=<build>/python STRATA_BACKEND=cuda python3 examples/torch_trainer/activations_compare.py \
        --device=cuda --json=torch-activations.json           # tools/gpu-check.sh runs this
    PYTHONPATH=<build>/python STRATA_BACKEND=host python3 examples/torch_trainer/activations_compare.py \
        --device=cpu --layers=2 --d-model=64 --seq=64 --batch=4 --steps=3   # the CTest run

Progress: a flushed line per step of every mode (mode, step i of n, seconds); strata's runtime is
created after the two torch modes (its CPU tier is pinned at start: one step's activations and a
quarter more, unless STRATA_CPU_BYTES says otherwise); a mode that runs out of device memory is
reported and the others go on; past --timeout seconds (default 100) every thread's Python stack
is printed and the run exits 1. The default model saves about 3.4 GiB a step.

Exit status: 0 (prints PASS) when the modes agree; 1 (prints FAIL) otherwise (or --timeout); 2 on
a usage error; 77 when torch is not installed.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import json
import os
import statistics
import sys
import time

import strata  # the core module, no torch: parse_size for the arguments

# Imported by import_torch() once the arguments are checked: a usage error needs no torch.
torch = F = st = TinyTransformer = None


def import_torch():
    """torch, strata.torch and the trainer's model (model.py, beside this file, here larger),
    or exit 77 (CTest's "skipped") without torch."""
    global torch, F, st, TinyTransformer
    try:
        import torch as torch_module
    except ImportError:
        print("SKIP: torch is not installed (Debian: apt install python3-torch)", flush=True)
        sys.exit(77)
    from torch.nn import functional
    import strata.torch as strata_torch
    from model import TinyTransformer as model_class
    torch, F, st, TinyTransformer = torch_module, functional, strata_torch, model_class

MODES = ("torch", "save_on_cpu", "strata")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--steps", type=int, default=5, help="timed steps per mode (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--home", choices=("cpu", "nvme"), default="cpu",
                   help="strata mode: where the activations wait (default cpu)")
    p.add_argument("--window-bytes", default="auto",
                   help="strata mode: GPU-arena bytes its activations may hold at once (auto: a "
                        "quarter of what one step saves, at least four of its largest tensors)")
    p.add_argument("--prefetch-bytes", default="auto",
                   help="strata mode: how far ahead backward's loads are fetched (auto: half "
                        "the window)")
    p.add_argument("--tolerance", type=float, default=1e-5,
                   help="CUDA: largest relative loss difference allowed (default 1e-5)")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--timeout", type=float, default=100.0,
                   help="seconds the whole run may take (default 100, under gpu-check's 120): "
                        "past it, every thread's Python stack is printed and the run exits 1, so "
                        "a stall says where it is (0: no limit)")
    args = p.parse_args(argv)
    if args.timeout < 0:
        p.error("--timeout must be at least 0")
    for name in ("layers", "d_model", "heads", "seq", "batch", "vocab", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be at least 0")
    if args.d_model % args.heads:
        p.error(f"--d-model={args.d_model} does not divide into --heads={args.heads}")
    for name in ("window_bytes", "prefetch_bytes"):
        value = getattr(args, name)
        if value != "auto":
            try:
                setattr(args, name, strata.parse_size(value, name,
                                                      allow_zero=name == "prefetch_bytes"))
            except strata.InvalidArgumentError as error:
                p.error(f"--{name.replace('_', '-')}: {error}")
    if "auto" not in (args.window_bytes, args.prefetch_bytes) and \
            args.prefetch_bytes > args.window_bytes:
        p.error(f"--prefetch-bytes={args.prefetch_bytes} exceeds --window-bytes="
                f"{args.window_bytes}")
    return args


def saved_bytes(model, batch):
    """What autograd saves in one forward, counted by a pass-through hook: (total, largest)."""
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, *batch)
    del loss
    return sum(sizes), max(sizes)


def loss_of(model, tokens, targets):
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def say(text=""):
    """A line of progress, flushed at once: a run stopped by a timeout shows how far it got."""
    print(text, flush=True)


def train(mode, reference, batches, args, device, offload=None):
    """The losses of every step, the final weights, the step times and peak memory of `mode`."""
    model = copy.deepcopy(reference)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    losses, times = [], []
    peak = None
    for step, (x, y) in enumerate(batches):
        if step == args.warmup:
            synchronize(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            if offload is not None:
                offload.runtime.reset_peak_usage()
        start = time.perf_counter()
        if mode == "torch":
            loss = loss_of(model, x, y)
        elif mode == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=device == "cuda"):
                loss = loss_of(model, x, y)
        else:
            with offload:
                loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        synchronize(device)
        seconds = time.perf_counter() - start
        if step >= args.warmup:
            times.append(seconds)
        kind = "warm-up" if step < args.warmup else "timed"
        say(f"  {mode}: step {step + 1} of {len(batches)} ({kind}) {seconds:.3f} s")
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    weights = [p.detach().cpu() for p in model.parameters()]
    return {"losses": [float(v) for v in torch.stack(losses).cpu()], "weights": weights,
            "step_seconds": statistics.median(times), "torch_peak_bytes": peak}


def run_mode(mode, reference, batches, args, device, offload=None):
    """train(), or {"error": ...} when the mode runs out of device memory (plain torch may, where
    the offloading modes fit: that is a result, not a failure of the run)."""
    say(f"{mode}: {len(batches)} steps ({args.warmup} warm-up)")
    start = time.perf_counter()
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    try:
        result = train(mode, reference, batches, args, device, offload)
    except Exception as error:  # noqa: BLE001 - only out-of-memory is a result; others re-raise
        if oom is None or not isinstance(error, oom):
            raise
        say(f"{mode}: out of device memory: {str(error).splitlines()[0]}")
        result = {"error": "out of device memory"}
    if device == "cuda":
        torch.cuda.empty_cache()
    say(f"{mode}: done in {time.perf_counter() - start:.1f} s")
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.timeout > 0:
        # A stall (on a GPU machine whose output is only read afterwards) says where it is.
        faulthandler.dump_traceback_later(args.timeout, exit=True)
    import_torch()
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("--device=cuda: torch has no CUDA device", file=sys.stderr)
        return 2
    started = time.perf_counter()

    torch.manual_seed(1234)
    reference = TinyTransformer(args.vocab, args.seq, args.d_model, args.heads, 4 * args.d_model,
                                args.layers).to(device)
    g = torch.Generator().manual_seed(7)
    batches = []
    for _ in range(args.warmup + args.steps):
        seq = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=g)
        batches.append((seq[:, :-1].to(device), seq[:, 1:].to(device)))
    per_step, largest = saved_bytes(reference, batches[0])
    window = args.window_bytes
    if window == "auto":
        window = max(per_step // 4, 4 * largest)
    prefetch = window // 2 if args.prefetch_bytes == "auto" else args.prefetch_bytes
    if prefetch > window:
        print(f"--prefetch-bytes={prefetch} exceeds the window ({window} bytes)", file=sys.stderr)
        return 2

    # strata's tiers: STRATA_* in the environment win; else an arena for the window and a
    # little more, and a CPU tier for one step's activations and a quarter more (the stash frees
    # them in backward; the next step's saves wait for those frees to land). The CPU tier is
    # pinned when the runtime starts: its size is start-up time.
    overrides = {}
    if "STRATA_GPU_BYTES" not in os.environ:
        overrides["gpu_bytes"] = str(window + (4 << 20))
    if "STRATA_CPU_BYTES" not in os.environ:
        staging = 0  # the NVMe tier's staging buffers come out of the CPU tier
        if os.environ.get("STRATA_NVME_PATHS"):
            staging = strata.parse_size(os.environ.get("STRATA_STAGING_BYTES", "256MiB"),
                                        "STRATA_STAGING_BYTES")
        overrides["cpu_bytes"] = str(per_step + per_step // 4 + staging + (64 << 20))
    n_params = sum(p.numel() for p in reference.parameters())
    say(f"model: {args.layers} blocks, d_model {args.d_model}, {args.heads} heads, seq "
        f"{args.seq}, batch {args.batch}, vocab {args.vocab}: {n_params} parameters; "
        f"{per_step / 2**20:.1f} MiB saved per step (largest tensor {largest / 2**20:.2f} MiB)")
    say(f"device {device}; strata: home {args.home}, window {window / 2**20:.1f} MiB, prefetch "
        f"{prefetch / 2**20:.1f} MiB; {args.warmup} warm-up and {args.steps} timed steps each")

    results = {}
    for mode in MODES[:2]:
        results[mode] = run_mode(mode, reference, batches, args, device)
    # strata's runtime last, so the other modes run without its arena and pinned tier.
    start = time.perf_counter()
    rt = strata.Runtime(**overrides)
    config = rt.config
    say(f"strata: Runtime() in {time.perf_counter() - start:.1f} s ({rt.backend} backend, GPU "
        f"arena {config['gpu_bytes'] / 2**20:.0f} MiB, CPU tier {config['cpu_bytes'] / 2**20:.0f}"
        " MiB)")
    if (device == "cuda") != (rt.backend == "cuda"):
        print(f"--device={device}: strata's runtime is on the {rt.backend} backend; set "
              f"STRATA_BACKEND={'cuda' if device == 'cuda' else 'host'}", file=sys.stderr)
        return 2
    offload = st.offload_activations(rt, home=args.home, window_bytes=window,
                                     prefetch_bytes=prefetch, min_bytes="64KiB")
    results["strata"] = run_mode("strata", reference, batches, args, device, offload)
    offload.stash.synchronize()
    stash = offload.stats()
    if "error" not in results["strata"]:
        results["strata"]["strata_arena_peak_bytes"] = stash["gpu_peak_bytes"]
    say(f"strata: {stash['loads']} loads ({stash['loads_prefetched']} prefetched, "
        f"{stash['loads_kept']} kept, {stash['loads_on_demand']} on demand), "
        f"{stash['window_waits']} window waits ({stash['window_wait_seconds']:.2f} s), "
        f"{stash['home_room_waits']} saves waited for the CPU tier, loads waited "
        f"{stash['load_wait_seconds']:.2f} s for moves home, {stash['errors']} errors")

    ran = [m for m in MODES if "error" not in results[m]]
    base = results[ran[0]] if ran else None
    worst = 0.0
    bitwise = True
    for mode in ran[1:]:
        r = results[mode]
        bitwise &= r["losses"] == base["losses"] and all(
            torch.equal(a, b) for a, b in zip(r["weights"], base["weights"]))
        for a, b in zip(r["losses"], base["losses"]):
            worst = max(worst, abs(a - b) / max(abs(b), 1e-12))

    say(f"{'mode':<12} {'step (ms)':>10} {'vs ' + ran[0] if ran else '':>12} "
        f"{'torch peak (MiB)':>17} {'+ strata arena (MiB)':>21}")
    for mode in MODES:
        r = results[mode]
        if "error" in r:
            say(f"{mode:<12} {r['error']}")
            continue
        peak = "-" if r["torch_peak_bytes"] is None else f"{r['torch_peak_bytes'] / 2**20:.1f}"
        arena = r.get("strata_arena_peak_bytes")
        arena = "-" if arena is None else f"{arena / 2**20:.1f}"
        say(f"{mode:<12} {r['step_seconds'] * 1e3:10.2f} "
            f"{r['step_seconds'] / base['step_seconds']:11.2f}x {peak:>17} {arena:>21}")
    say(f"losses: {'bitwise equal' if bitwise else f'largest relative difference {worst:.3g}'}"
        f" across the modes that ran ({', '.join(ran)})")
    say(f"the whole run: {time.perf_counter() - started:.1f} s")

    if args.json:
        out = {"device": device, "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
               "torch": torch.__version__,
               "model": {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq",
                                                       "batch", "vocab")},
               "parameters": n_params, "saved_bytes_per_step": per_step,
               "largest_saved_bytes": largest, "window_bytes": window,
               "prefetch_bytes": prefetch, "home": args.home, "steps": args.steps,
               "bitwise": bitwise, "max_relative_loss_difference": worst,
               "modes": {m: {k: v for k, v in r.items() if k != "weights"}
                         for m, r in results.items()},
               "strata_stats": {k: v for k, v in stash.items() if not isinstance(v, str)}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")

    ok = stash["errors"] == 0 and stash["loads"] > 0 and "error" not in results["strata"]
    if not ok:
        say("the strata run failed, its stash failed or it loaded nothing")
    if device == "cpu" and (len(ran) < len(MODES) or not bitwise):
        say("on the CPU every mode must run and be bitwise equal to the others, and they are not")
        ok = False
    if device == "cuda" and worst > args.tolerance:
        say(f"the losses differ by {worst:.3g} relative, more than --tolerance {args.tolerance:g}")
        ok = False
    say("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
