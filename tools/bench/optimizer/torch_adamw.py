#!/usr/bin/env python3
"""Times torch.optim.AdamW(foreach=True) on the CPU, for comparison with
`offload-bench --workload=optimizer` (docs/bench.md). Run by hand; offload-bench does not use it.

    python3 tools/bench/optimizer/torch_adamw.py --params=100M [--repeat=5] [--threads=N]

The parameters are fp32 (torch's CPU Adam steps fp32 parameters; there is no fp16 master/copy
split as in strata's step), split into tensors of at most 16 Mi elements as offload-bench splits
them, with fp32 gradients; the hyper-parameters are offload-bench's (lr 1e-3, betas 0.9/0.999,
eps 1e-8, weight decay 0.01). One warm-up step (it creates the moments), then --repeat timed
steps; prints one JSON object on stdout:

    {"params": ..., "torch_seconds": <median step>, "threads": ..., "all_step_seconds": [...],
     "torch_version": "...", "foreach": true, "dtype": "fp32", "tensors": ...}

Exit 2 on a bad flag, 1 when torch cannot be imported.
"""
import argparse
import json
import re
import statistics
import sys
import time

MAX_TENSOR_PARAMS = 1 << 24  # as offload-bench's optimizer workload
SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


def param_count(text: str) -> int:
    """Digits with an optional K, M or G suffix (10^3, 10^6, 10^9), as offload-bench --params."""
    match = re.fullmatch(r"([0-9]+)([KMGkmg]?)", text)
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a parameter count: use digits with an optional K, M or G suffix "
            "(10^3, 10^6, 10^9), e.g. 1000000, 1M, 100M")
    return int(match.group(1)) * SUFFIXES[match.group(2).upper()]


def positive(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer")
    return int(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=param_count, default=param_count("32M"),
                        help="parameters (default 32M)")
    parser.add_argument("--repeat", type=positive, default=5,
                        help="timed steps after one warm-up (default 5)")
    parser.add_argument("--threads", type=positive, default=None,
                        help="torch.set_num_threads (default: torch's own choice)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError as error:
        print(f"torch_adamw.py: cannot import torch ({error}); install python3-torch or "
              "pip install torch", file=sys.stderr)
        return 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    tensors = (args.params + MAX_TENSOR_PARAMS - 1) // MAX_TENSOR_PARAMS
    counts = [args.params // tensors + (1 if t < args.params % tensors else 0)
              for t in range(tensors)]
    params = []
    for count in counts:
        p = torch.nn.Parameter(torch.empty(count, dtype=torch.float32).uniform_(-0.05, 0.05))
        p.grad = torch.empty(count, dtype=torch.float32).uniform_(-1e-2, 1e-2)
        params.append(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.01, foreach=True)
    optimizer.step()  # warm-up: creates exp_avg and exp_avg_sq
    seconds = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    # The lower middle step for an even count, as offload-bench reports its median.
    median = sorted(seconds)[(len(seconds) - 1) // 2]
    print(json.dumps({
        "params": args.params,
        "torch_seconds": round(median, 6),
        "threads": torch.get_num_threads(),
        "all_step_seconds": [round(s, 6) for s in seconds],
        "torch_version": torch.__version__,
        "foreach": True,
        "dtype": "fp32",
        "tensors": tensors,
        "mean_seconds": round(statistics.mean(seconds), 6),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
