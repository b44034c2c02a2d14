#!/usr/bin/env python3
"""torch_trainer: a small transformer trained with PyTorch, its parameters offloaded through
strata.torch, checked step by step against the same model trained with torch.optim.AdamW in
memory.

The model: token and position embeddings, two pre-LayerNorm blocks (causal multi-head
self-attention written with nn.Linear q/k/v/o, then an MLP, each with a residual), a final
LayerNorm and an LM head. The task: next-token prediction on sequences drawn from a fixed random
Markov chain (each token has a few likely successors), so the loss can fall well below ln(vocab).

Two identical models are built from one seed. One is wrapped with strata.torch.offload() (its
parameters homed on NVMe when STRATA_NVME_PATHS is set, else in the CPU tier) and trained with
strata.torch.OffloadAdamW (moments on NVMe likewise); the other stays in memory and is trained
with torch.optim.AdamW(foreach=False): same hyper-parameters, same batches, gradient clipping in
both (strata: max_grad_norm; torch: clip_grad_norm_). --overlap-step runs strata's Adam during
backward (the overlapped step: bitwise the same training; the steps where clipping bites roll
their early work back); every row shows the optimizer time the step exposed after backward
("opt ms"), and with overlap what ran early. With a GPU arena (STRATA_GPU_BYTES) that
holds the parameters but not the gradients too, tensors move between tiers every step.

The forward and backward passes are the same operations on the same values in both runs; only
the AdamW arithmetic differs (strata's CPU kernel vs torch's), by float32 rounding. So the losses
agree to about 2e-7 relative, and --tolerance (default 1e-4) leaves a wide margin.

--zero-stage=1|2|3: data parallel over the ranks of a job (`strata-run -n N`, or any launcher
setting RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; alone, a job of one rank) through
strata.torch.zero_shard(): every rank builds the same model, trains on its slice of each global
batch (--batch sequences, divided among the ranks), and the gradients are averaged by strata's
ZeRO engine over strata's Communicator (torch.distributed is not used). Parameters are homed in
the CPU tier (stage 3: each rank's shards; on NVMe when STRATA_NVME_PATHS is set), AdamW states
likewise; stage 3 gathers each layer's parameters for its forward and again for its backward,
at most --max-live-bytes at once. Rank 0 also trains the reference, torch.optim.AdamW on the
whole global batch in one process, and checks every step's loss (the mean of the ranks' losses)
against it within --tolerance; every rank checks that all ranks hold the same parameters, and
rank 0 that they are the reference's within 1e-3 (relative L2 over the whole model). The ranks'
gradients are summed in another order than one process's over the whole batch, so the runs are
not bitwise equal: the losses agree to within 3.3e-7 relative over 30 steps (measured on 1, 2
and 3 ranks, stages 1-3); CTest holds them to 1e-6 (issue 15's rule for fp32).
--param-home=gpu|cpu|nvme puts the parameters (stage 3: the shards) there instead.
--save-sharded=DIR writes the sharded checkpoint after the last step; --load-sharded=DIR starts
from one (saved at any world size and stage) and trains the remaining steps up to --steps,
checked against a reference that trained all of them.

Exit status: 0 (prints PASS) when every step's losses agree within --tolerance and the strata
loss fell (final < 0.7 x initial); 1 (prints FAIL) otherwise; 2 on a usage error; 77 when
torch is not installed.

    PYTHONPATH=<build>/python STRATA_BACKEND=host python3 examples/torch_trainer/train.py
    PYTHONPATH=<build>/python python3 examples/torch_trainer/train.py --device=cuda   # GPU
    PYTHONPATH=<build>/python STRATA_BACKEND=host <build>/tools/strata-run -n 3 \
        python3 examples/torch_trainer/train.py --zero-stage=3
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import strata  # the core module, no torch: parse_size for the arguments

# gpt.py's PRESETS' names (kept here too: a usage error needs no torch).
GPT_PRESETS = ("gpt-tiny", "gpt-mini", "gpt-small", "gpt-medium", "gpt-large", "gpt-xl",
               "gpt-2.7b", "gpt-6.7b", "gpt-13b", "gpt-20b", "gpt-30b")

# torch, strata.torch and the model (model.py, beside this file) are imported by import_torch()
# once the arguments are checked: a usage error needs no torch.

def import_torch():
    """torch, strata.torch and workload.py, or exit 77 (CTest's "skipped") without torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP: torch is not installed (Debian: apt install python3-torch)", flush=True)
        sys.exit(77)
    import workload  # beside this file
    import strata.torch as st
    return workload, st


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--model", default="tiny", metavar="MODEL",
                   help="tiny (model.py's transformer on Markov sequences, default), gpt "
                        "(gpt.py's GPT, gpt-tiny's sizes unless the flags below give others) or "
                        "a GPT preset: " + ", ".join(GPT_PRESETS))
    for flag, what in (("layers", "transformer blocks"), ("d-model", "model width"),
                       ("heads", "attention heads"), ("vocab", "vocabulary size"),
                       ("seq-len", "tokens per sequence")):
        p.add_argument(f"--{flag}", type=int, default=None,
                       help=f"GPT: {what} (over the preset's)")
    p.add_argument("--untied", action="store_true", help="GPT: an LM head of its own")
    p.add_argument("--describe", action="store_true",
                   help="print the model's sizes and parameter count (built on the meta "
                        "device: instant at any size) and exit")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when torch has CUDA and strata's runtime is on the cuda "
                        "backend, else cpu")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest relative difference allowed between the two runs' losses at "
                        "any step (default 1e-4)")
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=0,
                   help="0: one process, strata.torch.offload (default); 1, 2, 3: ZeRO-DP over "
                        "the ranks of the job through strata.torch.zero_shard")
    p.add_argument("--batch", type=int, default=None,
                   help="sequences per global batch (stage 0: model.py's BATCH, 8; ZeRO "
                        "stages: 12, divided among the ranks)")
    p.add_argument("--units", choices=("layer", "block"), default="layer",
                   help="ZeRO units: every module with parameters (layer, default) or each "
                        "transformer block whole (block)")
    p.add_argument("--bucket-bytes", default="64KiB",
                   help="ZeRO: gradient bytes per flat group (default 64KiB)")
    p.add_argument("--max-live-bytes", default="256KiB",
                   help="ZeRO stage 3: most gathered parameter bytes at once (default 256KiB)")
    p.add_argument("--param-home", choices=("auto", "gpu", "cpu", "nvme"), default="auto",
                   help="ZeRO: where the parameters live (stage 3: each rank's shards; nvme: "
                        "stage 3, with STRATA_NVME_PATHS). auto (default): stage 3 on NVMe when "
                        "STRATA_NVME_PATHS is set, else in the CPU tier; stages 1-2 in the GPU "
                        "tier on a GPU, else in the CPU tier")
    p.add_argument("--reference", choices=("torch", "accumulate"), default="torch",
                   help="ZeRO: what rank 0 checks against: torch (torch.optim.AdamW on the whole "
                        "batch, within --tolerance; default) or accumulate (strata's ZeRO in one "
                        "process, the ranks' slices as micro-batches: bitwise, with 1 or 2 ranks)")
    p.add_argument("--save-sharded", metavar="DIR", help="ZeRO: save the sharded checkpoint "
                   "into DIR after the last step")
    p.add_argument("--load-sharded", metavar="DIR", help="ZeRO: start from the sharded "
                   "checkpoint in DIR (any world size) and train the remaining steps")
    p.add_argument("--overlap-step", action="store_true",
                   help="the overlapped optimizer step (ZeroAdamW(overlap_step=True), at the "
                        "ZeRO stages ZeroAdamW(overlap_step=True)): each parameter's Adam runs "
                        "during backward, validated by step(); bitwise the same training")
    p.add_argument("--offload-activations", action="store_true",
                   help="stage 0: the tensors autograd saves in forward wait in strata "
                        "(strata.torch.offload_activations) until backward")
    p.add_argument("--activation-home", choices=("cpu", "nvme"), default="cpu",
                   help="with --offload-activations: where they wait (default cpu)")
    p.add_argument("--activation-window-bytes", default="256KiB",
                   help="with --offload-activations: the GPU-tier bytes they may hold at once")
    p.add_argument("--losses", metavar="FILE",
                   help="ZeRO: rank 0 writes every step's loss (the ranks' mean) to FILE, as a "
                        "JSON list of exact values (float.hex), to compare runs bitwise")
    p.add_argument("--torch-distributed", action="store_true",
                   help="ZeRO: initialise torch.distributed (gloo, env://) before strata, as a "
                        "trainer that uses it for its data loader or metrics does: strata joins "
                        "that job through torch's store, and torch reduces the final loss too")
    args = p.parse_args(argv)
    if args.model not in ("tiny", "gpt") + GPT_PRESETS:
        p.error(f"--model={args.model}: use tiny, gpt or a preset ({', '.join(GPT_PRESETS)})")
    sizes = ("layers", "d_model", "heads", "vocab", "seq_len")
    for flag in sizes:
        value = getattr(args, flag)
        if value is not None and args.model == "tiny":
            p.error(f"--{flag.replace('_', '-')} sizes a GPT: add --model=gpt (or a preset)")
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.d_model is not None or args.heads is not None:
        d = args.d_model or 64
        h = args.heads or 4
        if args.model == "gpt" and d % h:
            p.error(f"--d-model={d} is not a multiple of --heads={h}")
    if args.offload_activations and args.zero_stage != 0:
        p.error("--offload-activations is for --zero-stage=0 in this example")
    if args.param_home != "auto" and args.zero_stage == 0:
        p.error(f"--param-home={args.param_home} places zero_shard's parameters: add "
                "--zero-stage=1, 2 or 3")
    if args.param_home == "nvme" and args.zero_stage != 3:
        p.error(f"--param-home=nvme needs --zero-stage=3 (stage {args.zero_stage} keeps the whole "
                "model on every rank: gpu or cpu)")
    if args.steps < 2:
        p.error("--steps must be at least 2")
    if not args.tolerance > 0:
        p.error("--tolerance must be positive")
    if args.batch is None and args.zero_stage > 0:
        args.batch = 12  # stage 0's: 8
    if args.batch is not None and args.batch < 1:
        p.error("--batch must be at least 1")
    world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    if args.zero_stage == 0:
        if world > 1:
            p.error(f"--zero-stage=0 trains on one rank, but this job has WORLD_SIZE={world}; "
                    "use --zero-stage=1, 2 or 3")
        for flag in ("save_sharded", "load_sharded", "losses", "torch_distributed"):
            if getattr(args, flag):
                p.error(f"--{flag.replace('_', '-')} needs a ZeRO stage (--zero-stage=1, 2 or 3)")
    elif args.reference == "accumulate" and (args.load_sharded or world > 2):
        # Two ranks' gradients sum alike in any order; three or more associate differently in
        # the collective than in one process's accumulation (measured: 7e-7 apart at 4 ranks).
        p.error(f"--reference=accumulate is bitwise with 1 or 2 ranks (this job has {world}) "
                "and without --load-sharded")
    elif args.batch % world:
        p.error(f"--batch={args.batch} does not divide among the job's {world} ranks")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    workloads, st = import_torch()
    import torch
    if args.describe:
        return describe(args)
    if args.batch is None:
        args.batch = 12 if args.zero_stage > 0 else 8
    w = workloads.make(args, args.steps, args.batch)
    if args.zero_stage > 0:
        from zero_train import train_zero  # beside this file
        return train_zero(args, w)
    reference = w.build()
    n_params = sum(p.numel() for p in reference.parameters())
    param_bytes = 4 * n_params
    # The GPU arena: STRATA_GPU_BYTES when set; else room for the parameters (all acquired at the
    # end of forward) and a little more, but not for the gradients as well, so tensors move.
    overrides = {}
    if "STRATA_GPU_BYTES" not in os.environ:
        overrides["gpu_bytes"] = str(param_bytes + param_bytes // 2)
        if args.offload_activations:  # and the activations' window beside them
            overrides["gpu_bytes"] = str(int(overrides["gpu_bytes"]) + (4 << 20))
    rt = strata.Runtime(**overrides)

    backend = rt.backend
    chosen, error = workloads.choose_device(
        args.device, backend + (f":{rt.config['device']}" if backend == "cuda" else ""))
    if error:
        print(error, file=sys.stderr)
        return 2
    device = str(chosen)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)  # the runtime's GPU (LOCAL_RANK): torch's current one

    home = "nvme" if rt.has_nvme else "cpu"
    gpu_bytes = rt.config["gpu_bytes"]
    print(f"model: {n_params} parameters ({param_bytes / 1024:.0f} KiB fp32), {w.describe}, "
          f"batch {args.batch}")
    print(f"strata: backend {backend}, device {device}, GPU arena {gpu_bytes / 1024:.0f} KiB, "
          f"parameters homed in {home}, optimizer states in {home}")
    if gpu_bytes >= 2 * param_bytes:
        print("note: the GPU arena holds parameters and gradients together; set "
              "STRATA_GPU_BYTES below twice the model's size to make tensors move")

    model = copy.deepcopy(reference).to(device)
    reference.to(device)
    wrapped = st.offload(model, rt, home=home)
    opt = st.OffloadAdamW(
        wrapped, optimizer=st.ZeroAdamW(max_grad_norm=w.max_grad_norm,
                                        overlap_step=args.overlap_step, **w.hyper),
        offload_policy=st.OffloadPolicy(state_home=home))
    ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **w.hyper)

    offload = None
    if args.offload_activations:
        offload = st.offload_activations(rt, home=args.activation_home,
                                         window_bytes=args.activation_window_bytes,
                                         prefetch_bytes="64KiB", min_bytes="4KiB")
    batches = [(x.to(device), y.to(device))
               for x, y in (w.batch(step) for step in range(1, args.steps + 1))]
    print(f"{'step':>4}  {'strata':>10}  {'torch':>10}  {'rel. diff':>9}  {'opt ms':>7}")
    exposed = workloads.ExposedOptimizer(args.overlap_step)
    losses, ref_losses = [], []
    worst = 0.0
    clipped = 0
    start = time.perf_counter()
    for step, (x, y) in enumerate(batches, 1):
        rt.reset_peak_usage()
        if offload is not None:
            with offload:  # one step of the stash: forward's saved tensors go to strata
                loss = w.loss(wrapped, x, y)
        else:
            loss = w.loss(wrapped, x, y)
        loss.backward()
        result = opt.step()
        opt.zero_grad()
        clipped += result["clip_coef"] < 1.0
        opt_text = exposed.record(result, opt.stats())

        ref_loss = w.loss(reference, x, y)
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), w.max_grad_norm)
        ref_opt.step()
        ref_opt.zero_grad()

        a, b = loss.item(), ref_loss.item()
        rel = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, rel) if math.isfinite(rel) else math.inf
        losses.append(a)
        ref_losses.append(b)
        mark = "" if rel <= args.tolerance else "  <-- over tolerance"
        print(f"{step:4d}  {a:10.6f}  {b:10.6f}  {rel:9.2e}{opt_text}{mark}")
    elapsed = time.perf_counter() - start

    stats = rt.stats()
    moved = sum(m["bytes"] for m in stats["moves"].values())
    per_pair = ", ".join(f"{pair} {m['bytes'] / 1024:.0f} KiB"
                         for pair, m in stats["moves"].items() if m["bytes"])
    ostats = opt.stats()
    print(f"largest relative loss difference: {worst:.3g} (tolerance {args.tolerance:g})")
    print(f"strata loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(must fall below 0.7 x initial = {0.7 * losses[0]:.4f})")
    print(f"bytes moved between tiers: {moved} ({moved / 2**20:.2f} MiB: {per_pair or 'none'}); "
          f"optimizer NVMe read {ostats['nvme_bytes_read']}, "
          f"written {ostats['nvme_bytes_written']}")
    print(f"gradient clipping (max norm {w.max_grad_norm:g}) applied at {clipped} of "
          f"{args.steps} steps")
    print(exposed.summary())
    print(f"{args.steps} steps of both runs in {elapsed:.2f} s")
    if offload is not None:
        offload.stash.synchronize()
        a = offload.stats()
        print(f"activations: {a['tensors_offloaded']} tensors ({a['saved_bytes'] / 1024:.0f} KiB) "
              f"saved to {args.activation_home}, {a['tensors_kept_by_torch']} left to torch; "
              f"{a['loads']} loads ({a['loads_prefetched']} prefetched, {a['loads_kept']} kept, "
              f"{a['loads_on_demand']} on demand); stash peak {a['gpu_peak_bytes'] / 1024:.0f} "
              f"KiB of the GPU tier (window {offload.stash.window_bytes / 1024:.0f} KiB), the "
              f"tier's high-water mark in the last step "
              f"{rt.stats()['tiers'][0]['peak_used'] / 1024:.0f} KiB")
        if a["errors"] or a["gpu_peak_bytes"] > offload.stash.window_bytes or not a["loads"]:
            print("the activation stash failed, exceeded its window or loaded nothing")
            return 1

    ok = True
    if worst > args.tolerance:
        print(f"the losses differ by {worst:.3g} relative, more than --tolerance "
              f"{args.tolerance:g}")
        ok = False
    if not losses[-1] < 0.7 * losses[0]:
        print("the strata run's loss did not fall below 0.7 x its initial value")
        ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def describe(args) -> int:
    """--describe: the model's sizes and exact parameter count, from a build on the meta device
    (no memory behind the parameters: instant at any size), checked against gpt.py's formula."""
    import time

    import torch
    if args.model == "tiny":
        import model as m
        net = m.TinyTransformer()
        print(f"model tiny: {sum(p.numel() for p in net.parameters())} parameters")
        return 0
    import gpt
    import workload
    c = workload.gpt_config(args)
    start = time.perf_counter()
    net = gpt.GPT(c, device="meta")
    built = time.perf_counter() - start
    count = sum(p.numel() for p in net.parameters())
    assert all(p.device == torch.device("meta") for p in net.parameters())
    print(f"model {args.model}: {c.layers} blocks, d_model {c.d_model}, {c.heads} heads, d_mlp "
          f"{c.d_mlp}, vocab {c.vocab}, seq {c.seq_len}, {'tied' if c.tied else 'untied'} head")
    print(f"parameters: {count} ({count / 1e9:.3f} B; fp32 {4 * count / 2**30:.1f} GiB, "
          f"Adam states {12 * count / 2**30:.1f} GiB), formula {gpt.parameter_count(c)}; "
          f"built on the meta device in {built:.3f} s")
    if count != gpt.parameter_count(c):
        print("FAIL: the module's count is not the formula's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
