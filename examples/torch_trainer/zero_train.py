"""train.py --zero-stage=1|2|3: the transformer trained data-parallel with
strata.torch.zero_shard() over the ranks of a job, checked on rank 0 against torch's AdamW on
the whole global batch in one process (train.py's docstring has the details)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

import strata
import strata.torch as st
import workload as workloads  # beside this file


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def _one_process_zero(args, w, units, fetch, adamw, ranks):
    """strata's ZeRO at the same stage in this process alone (its own Runtime, a job of one
    rank), taking each step's global batch as `ranks` micro-batches."""
    import socket
    with socket.socket() as s:  # a free port: a one-rank rendezvous must not meet the job's
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    solo_rt = strata.Runtime(nvme_paths=None)
    solo = strata.Communicator.from_environment(
        solo_rt, rank=None, world_size=None, local_rank=None, master_addr="127.0.0.1",
        master_port=port, comm_backend="gloo")
    return st.zero_shard(
        w.build(), solo, stage=args.zero_stage, units=units,
        offload_policy=st.PlacementPolicy(param_home="cpu", state_home="cpu"),
        reduce_policy=st.ReducePolicy(bucket_bytes=args.bucket_bytes, accumulation_steps=ranks),
        fetch_policy=fetch, optimizer=adamw)


def _accumulate_step(model, w, x, y, ranks: int, per_rank: int):
    """One step of _one_process_zero's model: each rank's slice a micro-batch, its loss
    divided by `ranks` (the ranks' engine divides their gradients' sum by it; halving is exact
    in fp32 and commutes with every rounding of backward, and two addends sum alike in either
    order, so at 2 ranks the gradients are the same bits). Returns the micro-batches'
    losses."""
    losses = np.zeros(ranks, np.float64)
    for r in range(ranks):
        part = slice(r * per_rank, (r + 1) * per_rank)
        loss = w.loss(model, x[part], y[part])
        (loss / ranks).backward()
        losses[r] = loss.item()
    model.step()
    return losses


def train_zero(args, w) -> int:
    """`w`: the workload (workload.py: the model, the data, the hyper-parameters)."""
    rt = strata.Runtime()
    # The GPU is the runtime's (STRATA_DEVICE, else LOCAL_RANK: one per rank under strata-run
    # or torchrun); zero_shard computes there (the GPU tier is device memory), torch too.
    backend = rt.backend + (f":{rt.config['device']}" if rt.backend == "cuda" else "")
    device, error = workloads.choose_device(args.device, backend)
    if error:
        print(error, file=sys.stderr, flush=True)
        return 2
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if args.reference == "accumulate":
            print("--reference=accumulate: a second strata Runtime in this process would split "
                  "the GPU with the job's; use --reference=torch on CUDA", file=sys.stderr,
                  flush=True)
            return 2
    if args.torch_distributed:
        # The trainer's own torch.distributed (for a data loader or metrics): strata notices it
        # and joins the same job through torch's store (under torchrun: the agent's).
        import torch.distributed as dist
        dist.init_process_group("gloo")
    comm = strata.Communicator.from_environment(rt)
    rank, ranks = comm.rank, comm.size
    say = print if rank == 0 else (lambda *a, **k: None)
    home = "nvme" if rt.has_nvme else "cpu"
    # Stage 3: the shards in the CPU tier or on NVMe (ZeRO-Offload/Infinity), gathered into the
    # GPU arena for use. Stages 1-2 keep the whole model on every rank: in the GPU tier on a GPU
    # (acquired in place; the CPU tier would move every group and gradient buffer each
    # micro-step), in the CPU tier on the host backend (there the same memory).
    param_home = home if args.zero_stage == 3 else ("gpu" if device.type == "cuda" else "cpu")
    if args.param_home != "auto":
        param_home = args.param_home
    if param_home == "nvme" and not rt.has_nvme:
        print("--param-home=nvme: this runtime has no NVMe tier; set STRATA_NVME_PATHS to a "
              "directory on the drive (and STRATA_NVME_BYTES)", file=sys.stderr, flush=True)
        return 2
    per_rank = args.batch // ranks

    # The reference (rank 0's, and every rank's copy of the small transformer): the same values
    # on every rank (tiny: one seed; GPT: per-parameter seeds).
    meta = w.build_meta is not None
    reference = w.build() if rank == 0 or not meta else None
    if reference is not None:
        reference.to(device)  # torch's AdamW on the same device as the ranks
    n_params = w.parameters if meta else sum(p.numel() for p in reference.parameters())
    units = None if args.units == "layer" else (w.block,)
    fetch = st.FetchPolicy(max_live_bytes=args.max_live_bytes, prefetch_bytes="64KiB",
                           reuse_window_bytes="64KiB", persist_below_bytes="2KiB")
    adamw = st.ZeroAdamW(max_grad_norm=w.max_grad_norm, overlap_step=args.overlap_step,
                         **w.hyper)
    # The GPT goes to zero_shard on the meta device, each parameter's values drawn by name as
    # the engine is created (the same values as the materialized reference's, by gpt.py's
    # per-parameter seeds); the small transformer as a copy of the reference.
    model = st.zero_shard(
        w.build_meta() if meta else copy.deepcopy(reference), comm, stage=args.zero_stage,
        units=units, param_init=w.param_init,
        offload_policy=st.PlacementPolicy(param_home=param_home, state_home=home),
        reduce_policy=st.ReducePolicy(bucket_bytes=args.bucket_bytes), fetch_policy=fetch,
        optimizer=adamw)
    accumulated = None  # --reference=accumulate: strata in one process, the ranks' slices as
    if rank == 0 and args.reference == "accumulate":  # micro-batches
        # Without overlap: with --overlap-step the bitwise check then holds the overlapped step
        # to the plain one.
        accumulated = _one_process_zero(args, w, units, fetch,
                                        dataclasses.replace(adamw, overlap_step=False), ranks)
    layout = model.engine.layout()
    say(f"model: {n_params} parameters ({4 * n_params / 1024:.0f} KiB fp32), {w.describe}; "
        f"global batch {args.batch} ({per_rank} per rank)")
    say(f"strata: ZeRO stage {args.zero_stage} on {ranks} rank(s) over "
        f"{comm.backend}, {len(model.units)} units ({args.units}), {layout['groups']} groups, "
        f"computing on {device}, parameters homed in {param_home}, AdamW states in {home}"
        + ("; built on the meta device, each parameter's values drawn by name (param_init)"
           if meta else ""))

    batches = [(x.to(device), y.to(device))
               for x, y in (w.batch(step) for step in range(1, args.steps + 1))]
    first = 0
    if args.load_sharded:
        model.load_sharded(args.load_sharded)
        first = model.engine.step_count
        say(f"loaded {args.load_sharded}: {first} steps done; training steps {first + 1} to "
            f"{args.steps}")
        if first >= args.steps:
            say(f"the checkpoint has {first} steps, --steps is {args.steps}: nothing to train")
            return 2

    ref_opt = None
    if rank == 0:
        ref_opt = torch.optim.AdamW(reference.parameters(), foreach=False, **w.hyper)

    def reference_step(x, y) -> float:
        loss = w.loss(reference, x, y)
        loss.backward()
        nn.utils.clip_grad_norm_(reference.parameters(), w.max_grad_norm)
        ref_opt.step()
        ref_opt.zero_grad()
        return loss.item()

    if rank == 0:
        for x, y in batches[:first]:  # the steps the checkpoint holds
            reference_step(x, y)

    if accumulated is not None:
        say("reference: strata's ZeRO in one process (a job of one rank) on the whole global "
            f"batch as {ranks} micro-batches (accumulation_steps={ranks}, each loss / {ranks}): "
            "every rank's loss and the final weights must be bitwise equal")
    if args.reference == "accumulate":
        say(f"{'step':>4}  {'strata':>10}  {'one proc':>10}  {'abs. diff':>9}  {'opt ms':>7}")
    else:
        say(f"{'step':>4}  {'strata':>10}  {'torch':>10}  {'rel. diff':>9}  {'opt ms':>7}")
    exposed = workloads.ExposedOptimizer(args.overlap_step)  # rank 0's optimizer
    losses, worst, clipped = [], 0.0, 0
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    start = time.perf_counter()
    for step in range(first + 1, args.steps + 1):
        x, y = batches[step - 1]
        loss = w.loss(model, x[mine], y[mine])
        loss.backward()
        result = model.step()
        clipped += result["clip_coef"] < 1.0
        opt_text = exposed.record(result, model.engine.optimizer_stats())
        # The global batch's loss: the mean of the ranks' (equal slices).
        total = float(comm.all_reduce(np.array([loss.item()], np.float64))[0]) / ranks
        losses.append(total)
        if accumulated is not None or args.reference == "accumulate":
            each = np.zeros(ranks, np.float64)  # every rank's loss, exactly (the rest adds 0)
            each[rank] = loss.item()
            each = comm.all_reduce(each)
            if rank == 0:
                want = _accumulate_step(accumulated, w, x, y, ranks, per_rank)
                diff = float(np.max(np.abs(each - want)))
                worst = max(worst, diff) if math.isfinite(diff) else math.inf
                mark = "  bitwise" if diff == 0 else "  <-- not bitwise"
                say(f"{step:4d}  {total:10.6f}  {float(np.mean(want)):10.6f}  {diff:9.2e}"
                    f"{opt_text}{mark}")
            continue
        if rank == 0:
            want = reference_step(x, y)
            rel = _relative(total, want)
            worst = max(worst, rel) if math.isfinite(rel) else math.inf
            mark = "" if rel <= args.tolerance else "  <-- over tolerance"
            say(f"{step:4d}  {total:10.6f}  {want:10.6f}  {rel:9.2e}{opt_text}{mark}")
    elapsed = time.perf_counter() - start
    if args.losses and rank == 0:
        import json
        with open(args.losses, "w") as f:
            json.dump([float(v).hex() for v in losses], f)
    torch_agrees = True
    if args.torch_distributed:
        import torch.distributed as dist
        mine_last = torch.tensor([float(loss.item())], dtype=torch.float64)
        dist.all_reduce(mine_last)  # the same sum strata's communicator took
        torch_agrees = float(mine_last[0]) / ranks == losses[-1]
        say(f"torch.distributed ({dist.get_backend()}, rank {dist.get_rank()} of "
            f"{dist.get_world_size()}) reduced the last loss to {float(mine_last[0]) / ranks:.6f}"
            f": {'the same as' if torch_agrees else 'NOT the same as'} strata's")

    # Every rank holds the same parameters (stages 1-2: its own whole copy; stage 3: what the
    # gathers give): the largest and smallest over the ranks are its own.
    replica = 0.0
    for prm in model._params:
        value = model.read_parameter(prm.name).numpy()
        high = comm.all_reduce(value, "max")
        low = comm.all_reduce(value, "min")
        replica = max(replica, float(np.max(high - low)))
    full = model.full_state_dict()
    # The whole model's relative L2 difference to the reference. (Not tensor by tensor: the
    # attention key biases have a zero gradient, the softmax being blind to a shift shared by
    # every key, so theirs is rounding noise, which Adam's normalization turns into steps of
    # about lr: they drift apart by ~1e-3 while every other tensor agrees to ~1e-5.)
    weights = 0.0
    if accumulated is not None:  # bitwise: the largest absolute difference, tensor by tensor
        other = accumulated.full_state_dict()
        weights = max(float((full[n] - other[n]).abs().max()) for n in full)
        accumulated.close()
    elif rank == 0:
        ref_state = {n: v.detach().cpu() for n, v in reference.state_dict().items()}
        diff2 = sum(float(((full[n].cpu() - v).double() ** 2).sum())
                    for n, v in ref_state.items())
        norm2 = sum(float((v.double() ** 2).sum()) for v in ref_state.values())
        weights = math.sqrt(diff2 / max(norm2, 1e-30))
    if args.save_sharded:
        model.save_sharded(args.save_sharded)
        say(f"saved the sharded checkpoint (step {model.engine.step_count}) in "
            f"{args.save_sharded}")

    stats, memory = model.stats(), model.memory()
    ok = torch_agrees
    # Where the parameters are: the shards (stage 3) in their home. Every rank checks its own.
    homed = memory["params"].get(param_home, 0)
    if homed == 0:
        print(f"rank {rank}: no parameter bytes in the {param_home} tier, its home "
              f"({memory['params']})", flush=True)
        ok = False
    if rank == 0:
        if args.reference == "accumulate":
            say(f"largest difference between a rank's loss and the one-process micro-batch's: "
                f"{worst:g}; between the final weights: {weights:g} (both must be 0)")
        else:
            say(f"largest relative loss difference: {worst:.3g} (tolerance {args.tolerance:g})")
        say(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.reference == "torch":
            say(f"largest difference between the ranks' parameters: {replica:g}; the weights' "
                f"relative L2 difference to the reference: {weights:.3g} (must be below 1e-3)")
        else:
            say(f"largest difference between the ranks' parameters: {replica:g}")
        say(f"rank 0 model states: {memory['model_states']} bytes (params "
            f"{sum(memory['params'].values())}, {homed} of them in {param_home}; grads "
            f"{sum(memory['grads'].values())}, "
            f"optimizer {sum(memory['optimizer_states'].values())}); "
            f"last step's communication {stats['last_step_comm_bytes']} bytes")
        if args.zero_stage == 3:
            say(f"stage 3: {stats['fetches']} fetches, {stats['gathers_on_demand']} gathered on "
                f"demand, {stats['gathers_prefetched']} prefetched ({stats['prefetch_late']} "
                f"late), {stats['reuses']} reuses, {stats['order_changes']} order changes; "
                f"gathered peak {stats['gathered_peak_bytes']} bytes "
                f"(max_live_bytes {args.max_live_bytes})")
        say(f"gradient clipping (max norm {w.max_grad_norm:g}) applied at {clipped} of "
            f"{len(losses)} steps")
        say(exposed.summary())
        say(f"{len(losses)} steps in {elapsed:.2f} s (rank 0 trains the reference too)")
        if args.reference == "accumulate" and (worst != 0 or weights != 0):
            say("the run is not bitwise equal to the one-process run")
            ok = False
        if args.reference == "torch" and worst > args.tolerance:
            say(f"the losses differ by {worst:.3g} relative, more than --tolerance "
                f"{args.tolerance:g}")
            ok = False
        if args.reference == "torch" and weights > 1e-3:
            say(f"the weights differ from the reference's by {weights:.3g} (relative L2), more "
                "than 1e-3")
            ok = False
        if not first and not losses[-1] < 0.7 * losses[0]:
            say("the loss did not fall below 0.7 x its initial value")
            ok = False
    if replica != 0.0:
        print(f"rank {rank}: the ranks' parameters differ (by up to {replica:g})", flush=True)
        ok = False
    # Every rank exits with rank 0's verdict.
    ok = bool(comm.all_reduce(np.array([0 if ok else 1], np.int32), "max")[0] == 0)
    say("PASS" if ok else "FAIL", flush=True)
    model.close()  # the hooks hold the engine and its Communicator: leave the job cleanly
    del model, full
    gc.collect()
    comm.barrier()
    return 0 if ok else 1
