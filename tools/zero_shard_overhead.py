#!/usr/bin/env python3
"""What strata.torch.zero_shard costs per training step beyond torch's own work: a model of many
small layers (where the wrapper's per-parameter calls show, not the arithmetic), trained by plain
torch (the baseline, in the same run) and by zero_shard at stages 1-3 on one rank.

    PYTHONPATH=<build>/python zero_shard_overhead.py [--layers 24] [--width 32] [--steps 40]

Prints the median step (forward, backward, step) of each, its ratio to plain torch, and the
extra time per parameter. On the host backend every acquisition that a host consumer reads
through DLPack synchronizes with strata's stream; on a GPU torch's stream waits instead, so the
host-side figure here is an upper bound of the wrapper's own cost. Exit 0 after a report; 2 on a
bad flag; 77 without torch.
"""

import argparse
import socket
import statistics
import sys
import time

try:
    import torch
    from torch import nn
except ImportError:
    print("SKIPPED: torch is not importable")
    sys.exit(77)

import strata
import strata.torch as st


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make(layers, width):
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*modules)


def timed(step, steps, warmup):
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def plain(args, x, y):
    model = make(args.layers, args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    return timed(step, args.steps, args.warmup)


def sharded(args, x, y, stage):
    rt = strata.Runtime(backend=args.backend, gpu_bytes="64MiB", cpu_bytes="64MiB",
                        nvme_paths=None, staging_bytes="8MiB")
    comm = strata.Communicator.from_environment(
        rt, rank=None, world_size=None, local_rank=None, master_addr="127.0.0.1",
        master_port=free_port(), comm_backend="gloo", comm_timeout="60s")
    # Every parameter partitioned at stage 3 (none kept whole), as in a large model.
    model = st.zero_shard(make(args.layers, args.width), comm, stage=stage,
                          fetch_policy=st.FetchPolicy(persist_below_bytes=0,
                                                      max_live_bytes="16MiB"),
                          optimizer=st.ZeroAdamW(lr=1e-3))
    x, y = x.to(model.device), y.to(model.device)

    def step():
        nn.functional.mse_loss(model(x), y).backward()
        model.step()

    try:
        return timed(step, args.steps, args.warmup)
    finally:
        model.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backend", default="host", choices=("host", "cuda", "auto"))
    args = parser.parse_args()
    for flag in ("layers", "width", "batch", "steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag}={getattr(args, flag)}: use 1 or more")
    if args.warmup < 0:
        parser.error(f"--warmup={args.warmup}: use 0 or more")
    params = args.layers * 2  # a weight and a bias per layer
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, args.width, generator=g)
    base = plain(args, x, y)
    print(f"{args.layers} Linear({args.width},{args.width}) layers, {params} parameters, "
          f"batch {args.batch}, median of {args.steps} steps, backend {args.backend}")
    print(f"{'system':<14}{'step ms':>9}{'/ torch':>9}{'extra us/param':>16}")
    print(f"{'torch':<14}{base * 1e3:>9.2f}{1.0:>9.2f}{'-':>16}")
    for stage in (1, 2, 3):
        t = sharded(args, x, y, stage)
        print(f"{'zero stage ' + str(stage):<14}{t * 1e3:>9.2f}{t / base:>9.2f}"
              f"{(t - base) / params * 1e6:>16.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
