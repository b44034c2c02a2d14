#!/usr/bin/env python3
"""Convert a PyTorch CUDA memory snapshot into an arena-replay trace.

Record one in the training script, e.g.:
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    ... run a few steps ...
    torch.cuda.memory._dump_snapshot("snapshot.pickle")

then:
    torch_snapshot_to_trace.py snapshot.pickle -o step.trace
    arena-replay --capacity=40GiB step.trace

Each 'alloc' event becomes 'a <id> <size>' and each 'free_completed' event 'f <id>' (the memory
is reusable only once the free completed on its stream). Ids are fresh per allocation because
the caching allocator reuses addresses. Segment events, 'free_requested', 'snapshot' and 'oom'
carry no tensor lifetime and are skipped.

The snapshot is read with a restricted unpickler that builds only plain Python values (dict,
list, str, int, ...): no code from the file runs and torch need not be installed.
"""

import argparse
import io
import pickle
import sys

# Built-in types a snapshot legitimately contains; anything else is refused.
_ALLOWED = {
    ("builtins", name)
    for name in ("dict", "list", "tuple", "set", "frozenset", "str", "bytes", "int", "float",
                 "bool", "complex")
} | {("collections", "OrderedDict")}


class SnapshotError(Exception):
    pass


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise SnapshotError(
            f"the pickle references {module}.{name}; a torch memory snapshot holds only plain "
            "dicts and lists, so this file is refused rather than executed (it may be another "
            "kind of pickle, e.g. a saved model)")


def load_snapshot(path):
    try:
        with open(path, "rb") if path != "-" else sys.stdin.buffer as f:
            data = f.read()
    except OSError as e:
        raise SnapshotError(f"cannot read '{path}': {e.strerror}") from None
    try:
        snapshot = _RestrictedUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except Exception as e:  # pickle raises many types on garbage input
        raise SnapshotError(
            f"'{path}' is not a pickle ({type(e).__name__}: {e}); expected the file written by "
            "torch.cuda.memory._dump_snapshot()") from None
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        keys = ", ".join(map(str, snapshot)) if isinstance(snapshot, dict) else type(snapshot).__name__
        raise SnapshotError(
            f"'{path}' is a pickle but not a memory snapshot: expected a dict with "
            f"'device_traces' (got {keys}); was history recorded with "
            "torch.cuda.memory._record_memory_history() before the snapshot was taken?")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list):
        raise SnapshotError(f"'{path}': 'device_traces' is a {type(traces).__name__}, not a list")
    return traces


def convert(events, out):
    """Writes the trace for one device's events to `out`; returns (allocs, frees, skipped)."""
    live = {}  # addr -> id
    next_id = 0
    allocs = frees = skipped = 0
    for i, event in enumerate(events):
        if not isinstance(event, dict) or "action" not in event:
            raise SnapshotError(f"trace event {i} is not a dict with an 'action': {event!r:.80}")
        action = event["action"]
        if action not in ("alloc", "free_completed"):
            continue
        try:
            addr, size = int(event["addr"]), int(event["size"])
        except (KeyError, TypeError, ValueError):
            raise SnapshotError(f"trace event {i} ({action}) lacks an integer addr/size") from None
        if action == "alloc":
            if addr in live:
                # The free fell outside the recorded window; the block is gone either way.
                out.write(f"f {live[addr]}\n")
                frees += 1
            if size <= 0:
                skipped += 1
                continue
            live[addr] = next_id
            out.write(f"a {next_id} {size}\n")
            next_id += 1
            allocs += 1
        elif addr in live:
            out.write(f"f {live.pop(addr)}\n")
            frees += 1
        else:
            skipped += 1  # allocated before recording started
    return allocs, frees, skipped


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="The trace format: one event per line, 'a <id> <bytes>' or 'f <id>'.")
    parser.add_argument("snapshot", help="snapshot pickle ('-' for stdin)")
    parser.add_argument("--device", type=int, default=0,
                        help="CUDA device whose trace to convert (default: 0)")
    parser.add_argument("-o", "--output", default="-", help="trace file (default: stdout)")
    args = parser.parse_args(argv)
    try:
        traces = load_snapshot(args.snapshot)
        if not 0 <= args.device < len(traces):
            raise SnapshotError(
                f"--device {args.device} is out of range: the snapshot has traces for "
                f"{len(traces)} device(s) (0..{len(traces) - 1})")
        header = f"# from {args.snapshot}, device {args.device}\n"
        if args.output == "-":
            sys.stdout.write(header)
            allocs, frees, skipped = convert(traces[args.device], sys.stdout)
        else:
            with open(args.output, "w", encoding="ascii") as stream:
                stream.write(header)
                allocs, frees, skipped = convert(traces[args.device], stream)
    except SnapshotError as e:
        print(f"torch_snapshot_to_trace: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"torch_snapshot_to_trace: cannot write '{args.output}': {e.strerror}",
              file=sys.stderr)
        return 1
    if allocs == 0:
        print(f"torch_snapshot_to_trace: warning: device {args.device} has no 'alloc' events; "
              "was memory history recorded?", file=sys.stderr)
    print(f"torch_snapshot_to_trace: {allocs} allocations, {frees} frees, {skipped} events "
          "skipped (frees of blocks allocated before recording started, empty allocations)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
