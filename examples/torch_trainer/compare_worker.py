#!/usr/bin/env python3
"""compare_worker: one system of compare.py trains gpt.py's GPT for a few steps in this process
and writes what it measured as JSON (compare.py runs one per system and per size, each in its own
process, so that peak memory and RSS are the system's own and an out-of-memory kills only it).

Systems (compare.py's docstring says why each is set up so):
  strata-cpu       strata.torch.zero_shard stage 3, parameter shards and AdamW states in the CPU
                   tier
  strata-nvme      the same, shards and states on NVMe (STRATA_NVME_PATHS, set by compare.py)
  fsdp2            torch's fully_shard + CPUOffloadPolicy, fused CPU AdamW, a process group of one
  fsdp2-nooffload  torch's fully_shard without offload (bf16 parameters and reduce, fp32 masters
                   on the GPU), fused CUDA AdamW: the compute-only reference, what a user with
                   enough GPU memory runs
  torch            plain PyTorch: the model and torch.optim.AdamW on the device

Every system: AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1), clipping at 1.0, the learning
rate warmed up linearly over the first --warmup-steps steps to --lr (step s of 1.. uses
lr * min(1, s / warmup_steps)) and constant after (strata: ZeroModule.set_lr before each step's
forward; torch, FSDP2: param_groups' "lr").

Data: --data=FILE (compare_data.write_data, built once by the parent: the same bits as
gpt.synthetic_batch) or, without it, gpt.synthetic_batch here (its Markov chain first: ~10 s at
vocab 32768). --perturb (tests: a disagreement) trains from step 2 on other batches (seed 8).

The JSON (compare_measure.write_json: json.dump(allow_nan=False), a non-finite number written as
null and its path listed in "non_finite_fields"; the loss has its own flag) appears at --json
once, at the end, with its final status; the process then leaves with os._exit at once (after
flushing and fsyncing it), so that no teardown (NCCL, CUDA, the interpreter) can hang a worker
whose figures are written. Meanwhile the same JSON with "status": "running" is written to
--json's path + ".partial" after the build and after every step (a worker killed or hung in a
step leaves the figures of the steps it finished there), and removed once the final one is
written. Fields:
  system, status ("ok" | "failed" | "oom" | "skipped" | "running"), error | skipped, fits
  steps: per step {step, lr, loss (null when non-finite), non_finite, seconds, forward_s,
      backward_s, optimizer_s (CUDA events on torch's stream on a GPU, else the host clock),
      exposed_transfer_s (strata: the host's waits for parameter gathers, else null),
      gpu_free_bytes (torch.cuda.mem_get_info's free at the step's end; null on the CPU);
      strata also skipped, grad_norm}
  lr_schedule {kind "linear-warmup", peak, warmup_steps, lrs}
  startup {python_s (exec to this module's first line, /proc/self/stat), import_torch_s,
      import_strata_s (strata systems), data_s (the batches loaded or built), build_s and
      build_parts (strata: runtime_s, runtime_create_s, communicator_s, shard_s; FSDP2:
      process_group_s, shard_s, materialize_s, optimizer_s; torch: materialize_s,
      optimizer_s), first_step_s, to_first_step_s (this module's first line to the first
      step's end)}
  data {source "file" | "generated", digest (compare_data.digest of the batches), path}
  memory (every figure in bytes; GPU ones null on the CPU): torch_max_allocated_bytes,
      torch_max_reserved_bytes, torch_reserved_end_bytes, gpu_free_start_bytes (after CUDA's
      start, before the system is built), gpu_free_end_bytes, gpu_free_min_bytes (the least
      free seen at a step's end), gpu_device_total_bytes, gpu_context_bytes (total - free at
      start: CUDA's context and whatever else holds the GPU), gpu_other_bytes (held neither
      by torch's allocator nor by strata's arena: NCCL's buffers, lazily loaded kernels,
      library handles; = free at start - free at end - torch's reserved at end - arena
      capacity), gpu_total_bytes (torch's peak reserved + strata's arena capacity + the other
      bytes when positive), gpu_peak_bytes (torch's peak allocated + strata's arena peak),
      gpu_memory_note; arena_capacity_bytes, arena_peak_bytes (strata); pinned_bytes
      (strata: its CPU tier's bytes pinned with the device, Runtime.startup(); torch, FSDP2:
      torch.cuda.host_memory_stats' peak, null where that torch has none), pinned_note;
      rss_peak_bytes (VmHWM), rss_bytes (VmRSS)

Exit status: 0 trained (JSON "ok"); 3 did not fit (out of memory: torch's, strata's
ResourceExhaustedError, MemoryError; JSON "fits": false); 4 the system is unavailable here (JSON
"skipped" says why); 1 any other failure (JSON "error"), a non-finite loss included ("non-finite
loss at step N": training stops there).
"""

import time

_T0 = time.perf_counter()  # the start-up phases count from here

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import traceback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from compare_measure import (GpuMemory, Timer, finite_or_none, host_memory,  # noqa: E402
                             python_start_s, torch_pinned, write_json)

EXIT_OOM, EXIT_SKIP = 3, 4
HYPER = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
PEAK_LR = 3e-3
MAX_GRAD_NORM = 1.0
SYSTEMS = ("strata-cpu", "strata-nvme", "fsdp2", "fsdp2-nooffload", "torch")
CLEANUPS = []  # run after the JSON is written, before os._exit: file removals only, never a hang


class Unavailable(Exception):
    """The system cannot run here (e.g. FSDP2 on torch 1.13): a skip, with the reason."""


def lr_at(step: int, warmup_steps: int, peak: float) -> float:
    """Step `step`'s (1-based) learning rate: linear warm-up to `peak`, constant after."""
    return peak * min(1.0, step / warmup_steps) if warmup_steps > 0 else peak


def fsdp2_api(torch, need: str):
    """(fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy) from torch.distributed.fsdp
    (torch >= 2.6) or torch.distributed._composable.fsdp (2.4, 2.5), or Unavailable(need...)."""
    version = torch.__version__.split("+")[0]
    try:
        major_minor = tuple(int(v) for v in version.split(".")[:2])
    except ValueError:
        major_minor = (0, 0)
    need = f"{need} needs torch >= 2.4; this torch is {version}"
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


def is_oom(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    strata = sys.modules.get("strata")
    if strata is not None and isinstance(error, strata.ResourceExhaustedError):
        return True
    text = str(error)
    return "out of memory" in text or "ResourceExhausted" in text or "CUDA error: out of" in text


class System:
    """What run() needs of a built system: the module, its optimizer step, the learning rate's
    setter and reader, figures at the end, and the host's gather waits (strata)."""

    def __init__(self, model, step, set_lr, get_lr, extra, waited_ns=None):
        self.model, self.step, self.set_lr, self.get_lr = model, step, set_lr, get_lr
        self.extra, self.waited_ns = extra, waited_ns


def timed(parts: dict, name: str, fn):
    t = time.perf_counter()
    value = fn()
    parts[name] = time.perf_counter() - t
    return value


def build_strata(args, torch, gpt, c, cuda, parts):
    import strata.torch as st
    import strata
    nvme = args.system == "strata-nvme"
    if nvme and not os.environ.get("STRATA_NVME_PATHS"):
        raise Unavailable("no NVMe directory (give --nvme-path or STRATA_NVME_PATHS)")
    rt = timed(parts, "runtime_s",
               lambda: strata.Runtime() if nvme else strata.Runtime(nvme_paths=None))
    if cuda and rt.backend != "cuda":
        raise Unavailable(f"strata's runtime is on the {rt.backend} backend, not cuda")
    # No launch variables: a job of one rank.
    comm = timed(parts, "communicator_s", lambda: strata.Communicator.from_environment(rt))
    home = "nvme" if nvme else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = timed(parts, "shard_s", lambda: st.zero_shard(
        gpt.GPT(c, device="meta", fused_attention=args.fused_attention), comm, stage=3,
        units=(gpt.Block,),
        param_init=lambda name, shape: initial(args, torch, gpt, c, name, shape),
        mp_policy=st.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype),
        offload_policy=st.PlacementPolicy(param_home=home, state_home=home),
        fetch_policy=st.FetchPolicy(max_live_bytes=args.max_live_bytes,
                                    prefetch_bytes=args.prefetch_bytes),
        optimizer=st.ZeroAdamW(lr=lr_at(1, args.warmup_steps, args.lr),
                               max_grad_norm=MAX_GRAD_NORM, **HYPER)))
    parts["runtime_create_s"] = rt.startup()["create_seconds"]

    def extra():
        tiers = {t["kind"]: t for t in rt.stats()["tiers"]}
        s = model.stats()
        started = rt.startup()
        pinned = started["pinned_bytes"] if rt.backend == "cuda" else 0
        note = ("the CPU tier's bytes pinned with the device so far (Runtime.startup(): it is "
                "pinned piece by piece as it fills)" if rt.backend == "cuda" else
                f"host backend: nothing is page-locked ({started['pinned_bytes']} bytes of the "
                "CPU tier registered with the host device)")
        return {"arena_capacity_bytes": tiers["gpu"]["capacity"],
                "arena_peak_bytes": tiers["gpu"]["peak_used"],
                "cpu_tier_bytes": tiers["cpu"]["capacity"],
                "cpu_tier_peak_bytes": tiers["cpu"]["peak_used"],
                "pinned_bytes": pinned, "pinned_note": note,
                "pinned_pieces": started["pinned_pieces"], "pin_seconds": started["pin_seconds"],
                "nvme_peak_bytes": tiers["nvme"]["peak_used"],
                "backend": rt.backend, "model_states_bytes": model.memory()["model_states"],
                "stage3": {k: s.get(k) for k in ("fetches", "gathers_on_demand",
                                                 "gathers_prefetched", "prefetch_late",
                                                 "gathered_peak_bytes")}}

    def waited_ns():  # the host's waits for gathers (NVMe reads included): exposed transfers
        return model.stats().get("fetch_wait_ns", 0)

    return System(model, model.step, model.set_lr, lambda: model.lr, extra, waited_ns)


def build_fsdp2(args, torch, gpt, c, cuda, parts):
    offload = args.system == "fsdp2"
    what = ("FSDP2 (fully_shard with CPUOffloadPolicy, and fused CPU AdamW)" if offload else
            "FSDP2 (fully_shard without offload, and fused CUDA AdamW)")
    if not cuda:
        fsdp2_api(torch, what)  # the version's reason first, where it applies
        raise Unavailable(f"{'FSDP2 with CPUOffloadPolicy' if offload else 'FSDP2 without offload'}"
                          " trains on a CUDA device; this run is on the CPU")
    fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy = fsdp2_api(torch, what)
    import torch.distributed as dist
    store = tempfile.NamedTemporaryFile(prefix="compare-fsdp2-store-", delete=False).name
    os.unlink(store)  # FileStore creates it
    CLEANUPS.append(lambda: _unlink(store))
    torch.cuda.set_device(0)
    parts["gpu_free_before_process_group_bytes"] = torch.cuda.mem_get_info()[0]
    timed(parts, "process_group_s", lambda: dist.init_process_group(
        "cpu:gloo,cuda:nccl", store=dist.FileStore(store, 1), rank=0, world_size=1))
    model = gpt.GPT(c, device="meta", fused_attention=args.fused_attention)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    kw = {"mp_policy": mp, **({"offload_policy": CPUOffloadPolicy()} if offload else {})}

    def shard():
        for block in model.blocks:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
    timed(parts, "shard_s", shard)
    # CPUOffloadPolicy: the sharded parameters (fp32 masters) live on the CPU; without it on the
    # GPU, in fp32, cast to bf16 for compute by the policy.
    device = "cpu" if offload else "cuda"

    def materialize():
        model.to_empty(device=device)
        with torch.no_grad():  # one rank: each local shard is the whole parameter
            for name, p in model.named_parameters():
                local = p.to_local() if hasattr(p, "to_local") else p
                if args.probe:
                    local.zero_()
                else:
                    local.copy_(gpt.init_parameter(name, tuple(p.shape), c).reshape(local.shape))
    timed(parts, "materialize_s", materialize)
    where = "CPU" if offload else "CUDA"
    lr = lr_at(1, args.warmup_steps, args.lr)

    def optimizer():
        try:
            return (torch.optim.AdamW(model.parameters(), lr=lr, fused=True, **HYPER),
                    f"fused {where} AdamW")
        except (RuntimeError, TypeError, ValueError) as e:  # recorded, never silent
            return (torch.optim.AdamW(model.parameters(), lr=lr, foreach=True, **HYPER),
                    f"foreach {where} AdamW (fused refused: {e})")
    opt, note = timed(parts, "optimizer_s", optimizer)
    return torch_system(torch, model, opt, note, cuda)


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def torch_system(torch, model, opt, note, cuda) -> System:
    """The optimizer step of plain torch and FSDP2: clipping, AdamW, zero_grad."""
    def step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def set_lr(lr):
        for group in opt.param_groups:
            group["lr"] = lr

    def extra():
        return {"optimizer": note, **(torch_pinned(torch) if cuda else {"pinned_bytes": 0})}

    return System(model, step, set_lr, lambda: opt.param_groups[0]["lr"], extra)


def build_torch(args, torch, gpt, c, cuda, parts):
    device = "cuda" if cuda else "cpu"
    def materialize():
        model = gpt.GPT(c, device="meta", fused_attention=args.fused_attention)
        if not args.probe:
            return gpt.materialize_in_pieces(model, device)
        model.to_empty(device=device)  # a fit probe: the values do not matter
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        return model
    model = timed(parts, "materialize_s", materialize)
    kw = {"fused": True} if cuda else {"foreach": False}
    opt = timed(parts, "optimizer_s", lambda: torch.optim.AdamW(
        model.parameters(), lr=lr_at(1, args.warmup_steps, args.lr), **kw, **HYPER))
    return torch_system(torch, model, opt,
                        "fused AdamW on the GPU" if cuda else "AdamW (foreach=False)", cuda)


BUILDERS = {"strata-cpu": build_strata, "strata-nvme": build_strata, "fsdp2": build_fsdp2,
            "fsdp2-nooffload": build_fsdp2, "torch": build_torch}


def initial(args, torch, gpt, c, name, shape):
    """A parameter's initial values: gpt.init_parameter's, or zeros in a fit probe (drawing
    billions of normal values would take longer than the probe may)."""
    if args.probe:
        return torch.zeros(shape)
    return gpt.init_parameter(name, shape, c)


def batches(args, torch, gpt, c, out: dict):
    """[(x, y) per step] from --data or gpt.synthetic_batch; --perturb's from step 2 on; in a
    fit probe random tokens (no Markov chain: ~10 s at vocab 32768)."""
    import compare_data
    if args.probe:
        g = torch.Generator().manual_seed(7)
        tokens = torch.randint(c.vocab, (args.steps, args.batch, c.seq_len + 1), generator=g)
        out["data"] = {"source": "random (a fit probe)"}
        return [(t[:, :-1], t[:, 1:]) for t in tokens]
    if args.data:
        pairs, meta = compare_data.load_data(args.data, c, args.steps, args.batch)
        out["data"] = {"source": "file", "path": args.data, "digest": meta["digest"]}
    else:
        pairs = [gpt.synthetic_batch(c, s, args.batch, seed=7) for s in range(1, args.steps + 1)]
        x = torch.stack([p[0] for p in pairs])
        y = torch.stack([p[1] for p in pairs])
        out["data"] = {"source": "generated", "digest": compare_data.digest(x, y)}
    if args.perturb:
        out["data"]["perturbed_from_step"] = 2
        for s in range(2, args.steps + 1):
            pairs[s - 1] = gpt.synthetic_batch(c, s, args.batch, seed=8)
    return pairs


def run(args, out: dict, publish) -> int:
    """Trains, filling `out` (the JSON) as it goes and calling publish() after the build and
    after every step. Returns the exit status."""
    startup = out["startup"]
    t = time.perf_counter()
    import torch
    startup["import_torch_s"] = time.perf_counter() - t
    if args.system.startswith("strata"):
        t = time.perf_counter()
        import strata  # noqa: F401  (timed apart from the build)
        import strata.torch  # noqa: F401
        startup["import_strata_s"] = time.perf_counter() - t
    import gpt
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise Unavailable("torch sees no CUDA device")
    c = gpt.GPTConfig(vocab=args.vocab, seq_len=args.seq_len, d_model=args.d_model,
                      heads=args.heads, layers=args.layers, tied=False)
    out.update({"batch": args.batch, "parameters": gpt.parameter_count(c),
                "tokens_per_step": args.batch * args.seq_len})
    lrs = [lr_at(s, args.warmup_steps, args.lr) for s in range(1, args.steps + 1)]
    out["lr_schedule"] = {"kind": "linear-warmup", "peak": args.lr,
                          "warmup_steps": args.warmup_steps, "lrs": lrs}
    t = time.perf_counter()
    data = batches(args, torch, gpt, c, out)  # first: a file that does not fit fails at once
    startup["data_s"] = time.perf_counter() - t
    gm = GpuMemory(torch, cuda)
    torch.manual_seed(0)
    parts = startup["build_parts"]
    t = time.perf_counter()
    system = BUILDERS[args.system](args, torch, gpt, c, cuda, parts)
    startup["build_s"] = time.perf_counter() - t
    out["fused_attention"] = any(getattr(m, "fused", False) for m in system.model.modules())
    publish()
    timer = Timer(torch, cuda)
    device = "cuda" if cuda else "cpu"
    steps = out["steps"]
    rc = 0
    for i in range(1, args.steps + 1):
        system.set_lr(lrs[i - 1])
        x, y = data[i - 1]
        x, y = x.to(device), y.to(device)
        before = system.waited_ns() if system.waited_ns else 0
        wall0 = time.perf_counter()
        t0 = timer.mark()
        if cuda and args.system == "torch":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = gpt.lm_loss(system.model, x, y)
        else:
            loss = gpt.lm_loss(system.model, x, y)
        if i == args.poison_step:  # tests: the non-finite path, as a diverged run meets it
            loss = loss * float("inf")
        t1 = timer.mark()
        loss.backward()
        t2 = timer.mark()
        result = system.step()
        t3 = timer.mark()
        wall1 = timer.done()
        after = system.waited_ns() if system.waited_ns else 0
        value = float(loss.item())
        record = {"step": i, "lr": system.get_lr(), "loss": finite_or_none(value),
                  "non_finite": not math.isfinite(value), "seconds": wall1 - wall0,
                  "forward_s": timer.seconds(t0, t1), "backward_s": timer.seconds(t1, t2),
                  "optimizer_s": timer.seconds(t2, t3),
                  "exposed_transfer_s": (after - before) / 1e9 if system.waited_ns else None,
                  "gpu_free_bytes": gm.boundary()}
        if isinstance(result, dict):  # strata's step result
            record["skipped"] = bool(result.get("skipped"))
            record["grad_norm"] = finite_or_none(result.get("grad_norm"))
        steps.append(record)
        if i == 1:
            startup["first_step_s"] = record["seconds"]
            startup["to_first_step_s"] = time.perf_counter() - _T0
        print(f"{args.system}: step {i} of {args.steps} lr {record['lr']:.3g} loss {value:.6f} "
              f"{record['seconds']:.3f} s", flush=True)
        if record["non_finite"]:
            out.update({"status": "failed", "error": f"non-finite loss at step {i} ({value})"})
            rc = 1
            break
        publish()
    info = system.extra()
    out.update(info)
    out.update(gm.report(info.get("arena_capacity_bytes") if args.system.startswith("strata")
                         else None, info.get("arena_peak_bytes")))
    out.update(host_memory())
    if rc == 0:
        out["status"] = "ok"
    return rc


def main(argv=None):
    """Runs the worker; returns (exit status, the JSON's dict). The caller leaves (os._exit)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    for name in ("vocab", "seq-len", "d-model", "heads", "layers", "batch", "steps"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--max-live-bytes", default="1GiB")
    p.add_argument("--prefetch-bytes", default="64MiB")
    p.add_argument("--fused-attention", action="store_true",
                   help="F.scaled_dot_product_attention where torch has it (no t x t scores)")
    p.add_argument("--data", help="the batches, from compare_data.write_data (default: built "
                                   "here with gpt.synthetic_batch)")
    p.add_argument("--lr", type=float, default=PEAK_LR, help=f"the peak rate (default {PEAK_LR})")
    p.add_argument("--warmup-steps", type=int, default=2,
                   help="linear warm-up of the rate over this many steps (default 2; 0: none)")
    p.add_argument("--probe", action="store_true",
                   help="a fit probe (compare_search.py): zero parameters and random tokens, "
                        "cheap to set up; only whether a step runs matters, not its loss")
    p.add_argument("--json", required=True)
    # Test hooks: other batches from step 2 (a disagreement); the loss times inf at step N (the
    # non-finite path); the JSON written, then sleep instead of leaving (a hang at exit).
    p.add_argument("--perturb", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--poison-step", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--hang-after-json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warmup_steps < 0:
        p.error("--warmup-steps must be at least 0")
    if not args.lr > 0:
        p.error("--lr must be positive")
    out = {"system": args.system, "status": "running", "fits": True, "steps": [],
           "startup": {"python_s": python_start_s(_T0), "build_parts": {}}}

    def publish():
        write_json(args.json + ".partial", out, final=False)
    try:
        rc = run(args, out, publish)
    except Unavailable as e:
        out.update({"status": "skipped", "skipped": str(e)})
        out.pop("fits")
        rc = EXIT_SKIP
    except BaseException as e:  # noqa: BLE001 - every failure is reported to compare.py
        if isinstance(e, KeyboardInterrupt):
            raise
        oom = is_oom(e)
        out.update({"status": "oom" if oom else "failed", "fits": not oom,
                    "error": f"{type(e).__name__}: {e}"[:2000], **host_memory()})
        rc = EXIT_OOM if oom else 1
        traceback.print_exc()
    write_json(args.json, out, final=True)
    _unlink(args.json + ".partial")
    return rc, out


if __name__ == "__main__":
    status, _ = main()
    sys.stdout.flush()
    sys.stderr.flush()
    for cleanup in CLEANUPS:
        cleanup()
    if "--hang-after-json" in sys.argv[1:]:
        while True:  # tests: a worker that hangs after its JSON (compare.py must report it)
            time.sleep(3600)
    os._exit(status)
