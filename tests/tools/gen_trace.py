#!/usr/bin/env python3
"""Generates a synthetic training-step allocation trace for arena-replay.

Shape of one step, repeated until --events is reached:
  forward:  per layer, 2-5 activations (256 KiB - 256 MiB, log-uniform) kept for backward, plus
            short-lived temporaries (256 B - 4 MiB) freed in random order a few events later
  backward: activations freed in reverse (LIFO), gradients allocated (sized like a layer's
            parameters) and freed at the step's end in random order, more temporaries
Parameters (one per layer, 1-64 MiB) stay live for the whole trace. arena-replay reports the
trace's peak live bytes, to choose a capacity relative to it.

usage: gen_trace.py [--events N] [--seed S] [--layers L] [-o FILE]
"""
import argparse
import math
import random
import sys


def log_uniform(rng, lo, hi, align=256):
    size = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    return max(align, size // align * align) if size >= align else size


def generate(events, seed, layers):
    rng = random.Random(seed)
    out = []
    live = {}
    next_id = [0]

    def alloc(size):
        i = next_id[0]
        next_id[0] += 1
        out.append(f"a {i} {size}")
        live[i] = size
        return i

    def free(i):
        out.append(f"f {i}")
        del live[i]

    temps = []

    def churn_temps(n):
        for _ in range(n):
            temps.append(alloc(log_uniform(rng, 256, 4 << 20, align=1)))
        while len(temps) > 6:
            free(temps.pop(rng.randrange(len(temps))))

    params = [alloc(log_uniform(rng, 1 << 20, 64 << 20)) for _ in range(layers)]
    while len(out) < events:
        activations = []
        for _ in range(layers):
            activations.append([alloc(log_uniform(rng, 256 << 10, 256 << 20))
                                for _ in range(rng.randint(2, 5))])
            churn_temps(rng.randint(2, 8))
        grads = []
        for layer in reversed(range(layers)):
            churn_temps(rng.randint(2, 8))
            grads.append(alloc(live[params[layer]]))
            for i in reversed(activations[layer]):
                free(i)
        rng.shuffle(grads)
        for i in grads:
            free(i)
        while temps:
            free(temps.pop())
    return out[:events]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("-o", "--output", default="-")
    args = parser.parse_args()
    lines = generate(args.events, args.seed, args.layers)
    text = (f"# gen_trace.py --events {args.events} --seed {args.seed} --layers {args.layers}\n"
            + "\n".join(lines) + "\n")
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="ascii") as f:
            f.write(text)


if __name__ == "__main__":
    main()
