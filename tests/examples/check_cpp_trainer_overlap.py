#!/usr/bin/env python3
"""examples/cpp_trainer --overlap-step (standard library only).

  check_cpp_trainer_overlap.py bitwise|kept [LAUNCHER...] TRAINER [TRAINER ARGS...]
      Runs the trainer (under LAUNCHER, e.g. `strata-run -n 2`, when given) without and with
      --overlap-step, the other arguments the same, and checks: the losses of every step and the
      final weights (weights_checksum) are bit for bit the same; both report one exposed
      optimizer time and one count of early elements per step; without overlap nothing ran
      early and nothing was rolled back. `kept` also checks that with overlap no step rolled its
      early work back: nothing clips or overflows in this trainer, so a rollback would mean a
      gradient landed again after its Adam had started, i.e. a micro-step the trainer did not
      announce as partial (GradCompletion::kMore). (How much ran early depends on timing: not
      checked.)

The environment (STRATA_BACKEND, STRATA_GPU_BYTES, ...) is passed on to the trainer."""
import json
import subprocess
import sys


def run(command):
    proc = subprocess.run([*command, "--json=-"], capture_output=True, text=True, timeout=240,
                          check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)}: exit {proc.returncode}\n{proc.stderr}")
    return json.loads(proc.stdout)


def check(condition, what):
    if not condition:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


def main():
    mode, command = sys.argv[1], sys.argv[2:]
    if mode not in ("bitwise", "kept"):
        sys.exit(f"unknown mode {mode!r}: use bitwise or kept")
    plain = run(command)
    overlapped = run([*command, "--overlap-step"])
    steps = plain["steps"]
    check(plain["overlap_step"] is False and overlapped["overlap_step"] is True,
          "the JSON says which run overlapped")
    check(plain["losses"] == overlapped["losses"], f"the {steps} losses are bit for bit the same")
    check(plain["weights_checksum"] == overlapped["weights_checksum"],
          f"the final weights are bit for bit the same ({plain['weights_checksum']} both)")
    for doc in (plain, overlapped):
        opt = doc["optimizer"]
        check(len(opt["exposed_seconds"]) == steps and len(opt["early_elements"]) == steps,
              f"one exposed optimizer time and early-element count per step "
              f"(overlap {doc['overlap_step']})")
    opt = plain["optimizer"]
    check(opt["rollbacks"] == 0 and not any(opt["early_elements"]),
          "without overlap nothing ran early, nothing was rolled back")
    opt = overlapped["optimizer"]
    early = sum(1 for e in opt["early_elements"] if e > 0)
    print(f"with overlap: {early} of {steps} steps kept early work, {opt['rollbacks']} rolled "
          f"back; exposed optimizer time {sum(opt['exposed_seconds']) * 1e3:.3f} ms in all "
          f"(without: {sum(plain['optimizer']['exposed_seconds']) * 1e3:.3f} ms)")
    if mode == "kept":
        check(opt["rollbacks"] == 0,
              "with overlap no step was rolled back: every partial micro-step was announced")
    print("check_cpp_trainer_overlap: ok")


if __name__ == "__main__":
    main()
