#!/usr/bin/env python3
"""Writes a pickle shaped like torch.cuda.memory._snapshot(), for testing the converter.

usage: make_fake_snapshot.py OUT.pickle [--foreign-class]

Device 0 allocates A (1 KiB) and B (2 KiB), frees A, allocates C (512 B) at A's address, frees
B, allocates D (4 KiB), frees C and D: 8 trace events, 4608 bytes live at the peak (C + D).
Segment, free_requested, snapshot and oom events and a free of an unknown address are mixed in
and must be skipped. Device 1 holds one allocation. --foreign-class adds an object of a
non-builtin class, which the converter must refuse to unpickle.
"""
import argparse
import fractions
import pickle


def event(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": [{"filename": "train.py", "line": 42, "name": "forward"}]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the pickle to write")
    parser.add_argument("--foreign-class", action="store_true",
                        help="add an object of a non-builtin class")
    args = parser.parse_args()
    a, b, d = 0x7F0000000000, 0x7F0000000400, 0x7F0000001000
    device0 = [
        event("segment_alloc", a, 2 << 20, 1),
        event("free_completed", 0x7F00DEAD0000, 256, 2),  # allocated before recording
        event("alloc", a, 1024, 3),
        event("alloc", b, 2048, 4),
        event("free_requested", a, 1024, 5),
        event("free_completed", a, 1024, 6),
        event("alloc", a, 512, 7),  # address reuse: a new tensor
        event("free_requested", b, 2048, 8),
        event("free_completed", b, 2048, 9),
        event("snapshot", 0, 0, 10),
        event("alloc", d, 4096, 11),
        event("oom", 0, 1 << 30, 12),
        event("free_completed", a, 512, 13),
        event("free_completed", d, 4096, 14),
        event("segment_free", a, 2 << 20, 15),
    ]
    device1 = [event("alloc", 0x7E0000000000, 1 << 20, 1)]
    snapshot = {"segments": [], "device_traces": [device0, device1]}
    if args.foreign_class:
        snapshot["extra"] = fractions.Fraction(1, 3)
    with open(args.output, "wb") as f:
        pickle.dump(snapshot, f)


if __name__ == "__main__":
    main()
