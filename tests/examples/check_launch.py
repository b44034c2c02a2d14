#!/usr/bin/env python3
"""Runs a training command under some launcher and checks that it trained exactly as the
reference run did (strata-run's): exit status 0, PASS in its output, every --expect text in
its output (the path meant to be tested ran: a restart happened, torch.distributed was used),
and the losses file it wrote (train.py --losses) bitwise equal to the reference's.

    check_launch.py --reference=REF.json --losses=OUT.json [--expect=TEXT]... -- CMD ...

Exit status 0 and "check_launch: ... bitwise" when all hold, 1 otherwise (saying which), 77
when the command itself exits 77 (torch missing: skipped)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def main(argv) -> int:
    if "--" not in argv:
        print("usage: check_launch.py --reference=F --losses=F [--expect=T]... -- CMD ...",
              file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(prog="check_launch.py")
    p.add_argument("--reference", required=True)
    p.add_argument("--losses", required=True)
    p.add_argument("--expect", action="append", default=[])
    args = p.parse_args(argv[:split])
    cmd = argv[split + 1:]
    if os.path.exists(args.losses):
        os.remove(args.losses)
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(run.stdout)
    if run.returncode == 77:
        return 77
    problems = []
    if run.returncode != 0:
        problems.append(f"the command exited with status {run.returncode}")
    if "PASS" not in run.stdout:
        problems.append("the command did not print PASS")
    problems += [f"its output lacks {text!r}" for text in args.expect if text not in run.stdout]
    try:
        with open(args.reference) as f:
            want = json.load(f)
        with open(args.losses) as f:
            got = json.load(f)
    except (OSError, ValueError) as e:
        problems.append(f"cannot compare the losses: {e}")
    else:
        if len(got) != len(want) or not want:
            problems.append(f"{len(got)} losses against the reference's {len(want)}")
        else:
            differ = [i + 1 for i, (a, b) in enumerate(zip(got, want)) if a != b]
            if differ:
                i = differ[0] - 1
                problems.append(f"the losses differ from the reference's at step(s) {differ} "
                                f"(step {i + 1}: {float.fromhex(got[i])!r} against "
                                f"{float.fromhex(want[i])!r})")
    if problems:
        print("check_launch: FAIL: " + "; ".join(problems), flush=True)
        return 1
    print(f"check_launch: {len(got)} steps, every loss bitwise equal to the reference run's",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
