#!/usr/bin/env python3
"""compare_worker: one system of compare.py trains gpt.py's GPT for a few steps in this process
and writes what it measured as JSON (compare.py runs one per system and per size, each in its own
process, so that peak memory and RSS are the system's own and an out-of-memory kills only it).

Systems (compare.py's docstring says why each is set up so):
  strata-cpu   strata.torch.zero_shard stage 3, parameter shards and AdamW states in the CPU tier
  strata-nvme  the same, shards and states on NVMe (STRATA_NVME_PATHS, set by compare.py)
  fsdp2        torch's fully_shard + CPUOffloadPolicy, fused CPU AdamW, a process group of one
  torch        plain PyTorch: the model and torch.optim.AdamW on the device

Exit status: 0 trained (JSON "ok"); 3 did not fit (out of memory: torch's, strata's
ResourceExhaustedError, MemoryError; JSON "fits": false); 4 the system is unavailable here (JSON
"skipped" says why); 1 any other failure (JSON "error").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

EXIT_OOM, EXIT_SKIP = 3, 4
HYPER = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MAX_GRAD_NORM = 1.0


class Unavailable(Exception):
    """The system cannot run here (e.g. FSDP2 on torch 1.13): a skip, with the reason."""


def fsdp2_api(torch):
    """(fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy) from torch.distributed.fsdp
    (torch >= 2.6) or torch.distributed._composable.fsdp (2.4, 2.5), or Unavailable."""
    version = torch.__version__.split("+")[0]
    try:
        major_minor = tuple(int(v) for v in version.split(".")[:2])
    except ValueError:
        major_minor = (0, 0)
    need = (f"FSDP2 (fully_shard with CPUOffloadPolicy, and fused CPU AdamW) needs torch >= 2.4; "
            f"this torch is {version}")
    if major_minor < (2, 4):  # not even imported: Debian's 1.13 fsdp fails to import on 3.11
        raise Unavailable(need)
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        return fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy
    except ImportError:
        pass
    try:
        from torch.distributed._composable.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy,
                                                        fully_shard)
        return fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy
    except ImportError:
        raise Unavailable(need) from None


def host_memory() -> dict:
    """VmHWM (peak RSS) and VmRSS of this process, in bytes (/proc/self/status)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return {"rss_peak_bytes": out.get("VmHWM"), "rss_bytes": out.get("VmRSS")}


def is_oom(error: BaseException) -> bool:
    import strata
    if isinstance(error, (MemoryError, strata.ResourceExhaustedError)):
        return True
    text = str(error)
    return "out of memory" in text or "ResourceExhausted" in text or "CUDA error: out of" in text


class Timer:
    """Step-part boundaries: CUDA events on torch's current stream on a GPU (the parts are the
    GPU stream's time between them, host waits included when the stream idled meanwhile), the
    host clock on the CPU; the step ends when its work is done (synchronize)."""

    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda

    def mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def done(self):
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1e3
        return b - a


def build_strata(args, torch, gpt, c, cuda):
    import strata
    import strata.torch as st
    nvme = args.system == "strata-nvme"
    if nvme and not os.environ.get("STRATA_NVME_PATHS"):
        raise Unavailable("no NVMe directory (give --nvme-path or STRATA_NVME_PATHS)")
    rt = strata.Runtime() if nvme else strata.Runtime(nvme_paths=None)
    if cuda and rt.backend != "cuda":
        raise Unavailable(f"strata's runtime is on the {rt.backend} backend, not cuda")
    comm = strata.Communicator.from_environment(rt)  # no launch variables: a job of one rank
    home = "nvme" if nvme else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = st.zero_shard(
        gpt.GPT(c, device="meta", fused_attention=args.fused_attention), comm, stage=3,
        units=(gpt.Block,),
        param_init=lambda name, shape: gpt.init_parameter(name, shape, c),
        mp_policy=st.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype),
        offload_policy=st.PlacementPolicy(param_home=home, state_home=home),
        fetch_policy=st.FetchPolicy(max_live_bytes=args.max_live_bytes,
                                    prefetch_bytes=args.prefetch_bytes),
        optimizer=st.ZeroAdamW(max_grad_norm=MAX_GRAD_NORM, **HYPER))

    def step():
        return model.step()

    def extra():
        tiers = {t["kind"]: t for t in rt.stats()["tiers"]}
        s = model.stats()
        return {"arena_capacity_bytes": tiers["gpu"]["capacity"],
                "arena_peak_bytes": tiers["gpu"]["peak_used"],
                "cpu_tier_bytes": tiers["cpu"]["capacity"],
                "cpu_tier_peak_bytes": tiers["cpu"]["peak_used"],
                "pinned_bytes": tiers["cpu"]["capacity"] if rt.backend == "cuda" else 0,
                "nvme_peak_bytes": tiers["nvme"]["peak_used"],
                "backend": rt.backend, "model_states_bytes": model.memory()["model_states"],
                "stage3": {k: s.get(k) for k in ("fetches", "gathers_on_demand",
                                                 "gathers_prefetched", "prefetch_late",
                                                 "gathered_peak_bytes")}}

    def waited_ns():  # the host's waits for gathers (NVMe reads included): exposed transfers
        return model.stats().get("fetch_wait_ns", 0)

    return model, step, extra, model.close, waited_ns


def build_fsdp2(args, torch, gpt, c, cuda):
    if not cuda:
        fsdp2_api(torch)  # the version's reason first, where it applies
        raise Unavailable("FSDP2 with CPUOffloadPolicy trains on a CUDA device; this run is on "
                          "the CPU")
    fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy = fsdp2_api(torch)
    import torch.distributed as dist
    store = tempfile.NamedTemporaryFile(prefix="compare-fsdp2-store-", delete=False).name
    os.unlink(store)  # FileStore creates it
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.FileStore(store, 1), rank=0,
                            world_size=1)
    model = gpt.GPT(c, device="meta", fused_attention=args.fused_attention)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    offload = CPUOffloadPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    model.to_empty(device="cpu")  # CPUOffloadPolicy: the sharded parameters live on the CPU
    with torch.no_grad():  # one rank: each local shard is the whole parameter
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.copy_(gpt.init_parameter(name, tuple(p.shape), c).reshape(local.shape))
    note = "fused CPU AdamW"
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=True, **HYPER)
    except (RuntimeError, TypeError, ValueError) as e:  # recorded, never silent
        opt = torch.optim.AdamW(model.parameters(), foreach=True, **HYPER)
        note = f"foreach CPU AdamW (fused refused: {e})"

    def step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def extra():
        return {"optimizer": note, **torch_pinned(torch)}

    def close():
        dist.destroy_process_group()
        try:
            os.unlink(store)
        except OSError:
            pass

    return model, step, extra, close, None


def torch_pinned(torch) -> dict:
    """torch's pinned host memory where this torch reports it (torch.cuda.host_memory_stats,
    newer torch only), else None."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return {"pinned_bytes": None, "pinned_note": "this torch does not report pinned bytes"}
    try:
        s = stats()
    except Exception as e:  # noqa: BLE001 - a report, not a failure
        return {"pinned_bytes": None, "pinned_note": f"host_memory_stats: {e}"}
    peak = s.get("allocated_bytes.peak", s.get("reserved_bytes.peak"))
    return {"pinned_bytes": peak, "pinned_note": "torch.cuda.host_memory_stats peak"}


def build_torch(args, torch, gpt, c, cuda):
    device = "cuda" if cuda else "cpu"
    model = gpt.materialize_in_pieces(
        gpt.GPT(c, device="meta", fused_attention=args.fused_attention), device)
    kw = {"fused": True} if cuda else {"foreach": False}
    opt = torch.optim.AdamW(model.parameters(), **kw, **HYPER)

    def step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def extra():
        return {"optimizer": "fused AdamW on the GPU" if cuda else "AdamW (foreach=False)",
                **(torch_pinned(torch) if cuda else {"pinned_bytes": 0})}

    return model, step, extra, lambda: None, None


BUILDERS = {"strata-cpu": build_strata, "strata-nvme": build_strata, "fsdp2": build_fsdp2,
            "torch": build_torch}


def run(args) -> dict:
    import torch
    import gpt
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise Unavailable("torch sees no CUDA device")
    c = gpt.GPTConfig(vocab=args.vocab, seq_len=args.seq_len, d_model=args.d_model,
                      heads=args.heads, layers=args.layers, tied=False)
    torch.manual_seed(0)
    started = time.perf_counter()
    model, step, extra, close, waited_ns = BUILDERS[args.system](args, torch, gpt, c, cuda)
    setup_s = time.perf_counter() - started
    timer = Timer(torch, cuda)
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    steps = []
    for i in range(1, args.steps + 1):
        # --perturb (the forced-disagreement test): other batches from step 2 on.
        seed = 8 if args.perturb and i >= 2 else 7
        x, y = gpt.synthetic_batch(c, i, args.batch, seed=seed)
        x, y = x.to(device), y.to(device)
        before = waited_ns() if waited_ns else 0
        wall0 = time.perf_counter()
        t0 = timer.mark()
        if cuda and args.system == "torch":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = gpt.lm_loss(model, x, y)
        else:
            loss = gpt.lm_loss(model, x, y)
        t1 = timer.mark()
        loss.backward()
        t2 = timer.mark()
        step()
        t3 = timer.mark()
        wall1 = timer.done()
        after = waited_ns() if waited_ns else 0
        steps.append({"step": i, "loss": float(loss.item()), "seconds": wall1 - wall0,
                      "forward_s": timer.seconds(t0, t1), "backward_s": timer.seconds(t1, t2),
                      "optimizer_s": timer.seconds(t2, t3),
                      "exposed_transfer_s": (after - before) / 1e9 if waited_ns else None})
        print(f"{args.system}: step {i} of {args.steps} loss {steps[-1]['loss']:.6f} "
              f"{steps[-1]['seconds']:.3f} s", flush=True)
    info = extra()
    fused = model_fused(model)
    out = {"system": args.system, "status": "ok", "fits": True, "steps": steps,
           "fused_attention": fused, "batch": args.batch,
           "parameters": gpt.parameter_count(c), "setup_s": setup_s,
           "tokens_per_step": args.batch * args.seq_len,
           "torch_max_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
           **info, **host_memory()}
    if args.system.startswith("strata") and cuda:
        out["gpu_peak_bytes"] = out["torch_max_allocated_bytes"] + out["arena_peak_bytes"]
    elif cuda:
        out["gpu_peak_bytes"] = out["torch_max_allocated_bytes"]
    else:
        out["gpu_peak_bytes"] = None
    close()
    return out


def model_fused(model) -> bool:
    """Whether the GPT's attention runs fused (SDPA): asked for and there in this torch."""
    return any(getattr(m, "fused", False) for m in model.modules())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", choices=tuple(BUILDERS), required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    for name in ("vocab", "seq-len", "d-model", "heads", "layers", "batch", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--max-live-bytes", default="1GiB")
    p.add_argument("--prefetch-bytes", default="64MiB")
    p.add_argument("--fused-attention", action="store_true",
                   help="F.scaled_dot_product_attention where torch has it (no t x t scores)")
    p.add_argument("--perturb", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    try:
        out, rc = run(args), 0
    except Unavailable as e:
        out, rc = {"system": args.system, "status": "skipped", "skipped": str(e)}, EXIT_SKIP
    except BaseException as e:  # noqa: BLE001 - every failure is reported to compare.py
        if isinstance(e, KeyboardInterrupt):
            raise
        oom = is_oom(e)
        out = {"system": args.system, "status": "oom" if oom else "failed", "fits": not oom,
               "error": f"{type(e).__name__}: {e}"[:2000], **host_memory()}
        rc = EXIT_OOM if oom else 1
        traceback.print_exc()
    with open(args.json, "w") as f:
        json.dump(out, f)
    return rc


if __name__ == "__main__":
    sys.exit(main())
