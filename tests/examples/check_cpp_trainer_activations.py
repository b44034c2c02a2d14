#!/usr/bin/env python3
"""examples/cpp_trainer --offload-activations (standard library only).

  check_cpp_trainer_activations.py bitwise TRAINER ARENA_REPLAY WINDOW [TRAINER ARGS...]
      Runs the trainer without and with --offload-activations (window WINDOW bytes, the other
      arguments the same) and checks: the losses of every step and the final weights
      (weights_checksum) are bit for bit the same; every saved activation was loaded and none
      failed; the activations saved per step are more than 2 x WINDOW; the stash's own GPU peak
      is within WINDOW; and the GPU tier's high-water mark with offload is at most the one
      without plus WINDOW (the model states the trainer keeps there, plus the window). Then
      arena-replay replays the stash's recorded GPU-tier lifetimes (--activation-trace) in an
      arena of exactly WINDOW bytes: every allocation fits.

  check_cpp_trainer_activations.py full-cpu TRAINER [TRAINER ARGS...]
      Runs the trainer with --offload-activations and the environment's small STRATA_CPU_BYTES:
      it must exit 1 (not crash) with one `cpp_trainer: ` line naming the activation stash and
      STRATA_CPU_BYTES, the fix.

The environment (STRATA_BACKEND, STRATA_GPU_BYTES, ...) is passed on to the trainer."""
import json
import os
import subprocess
import sys
import tempfile


def run(trainer, args, expect_rc=0):
    proc = subprocess.run([trainer, *args, "--json=-"], capture_output=True, text=True,
                          timeout=300, check=False)
    if proc.returncode != expect_rc:
        sys.exit(f"{' '.join([trainer, *args])}: exit {proc.returncode}, expected {expect_rc}\n"
                 f"{proc.stderr}")
    return json.loads(proc.stdout) if expect_rc == 0 else proc


def check(condition, what):
    if not condition:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


def bitwise(trainer, replay, window, args):
    with tempfile.TemporaryDirectory(prefix="strata-act-") as tmp:
        trace = os.path.join(tmp, "activations.trace")
        # The run without offload takes no activation flags.
        plain = run(trainer, [a for a in args if not a.startswith("--activation-")])
        offloaded = run(trainer, [*args, "--offload-activations",
                                  f"--activation-window-bytes={window}",
                                  f"--activation-trace={trace}"])
        check(plain["losses"] == offloaded["losses"],
              f"the {len(plain['losses'])} losses are bit for bit the same")
        check(plain["weights_checksum"] == offloaded["weights_checksum"],
              "the final weights are bit for bit the same "
              f"({plain['weights_checksum']} both)")
        a = offloaded["activations"]
        steps = offloaded["steps"]
        check(a["errors"] == 0 and a["loads"] > 0, f"{a['loads']} loads, no error")
        check(a["loads"] == a["loads_prefetched"] + a["loads_kept"] + a["loads_on_demand"],
              "every load was prefetched, kept or fetched on demand")
        check(a["loads_prefetched"] > 0, f"{a['loads_prefetched']} loads were prefetched")
        per_step = a["saved_bytes"] / steps
        check(per_step > 2 * window,
              f"{per_step:.0f} bytes of activations saved per step, > 2 x the {window}-byte window")
        check(a["gpu_peak_bytes"] <= window,
              f"the stash held at most {a['gpu_peak_bytes']} bytes of the GPU tier")
        peak_plain, peak = plain["gpu_tier_peak_bytes"], offloaded["gpu_tier_peak_bytes"]
        check(peak <= peak_plain + window,
              f"GPU tier high-water mark {peak} <= {peak_plain} (without offload) + {window}")
        proc = subprocess.run([replay, f"--capacity={window}", "--json", trace],
                              capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode not in (0, 1):
            sys.exit(f"arena-replay failed: {proc.stderr}")
        replayed = json.loads(proc.stdout)
        check(replayed["failed"] == 0 and replayed["allocations"] >= a["loads"],
              f"arena-replay: {replayed['allocations']} activation blocks fit an arena of the "
              f"window ({window} bytes; peak live {replayed['peak_live_bytes']}, worst "
              f"fragmentation {replayed['worst_fragmentation']:.2f}, "
              f"{replayed['compactions']} compactions)")


def full_cpu(trainer, args):
    proc = run(trainer, [*args, "--offload-activations"], expect_rc=1)
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith("cpp_trainer: ") and "of parameters and gradients" not in line]
    check(len(lines) == 1, f"one error line: {lines}")
    check("activation stash: saving activation" in lines[0] and "STRATA_CPU_BYTES" in lines[0],
          f"it names the stash and STRATA_CPU_BYTES: {lines[0]}")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    mode = sys.argv[1]
    if mode == "bitwise" and len(sys.argv) >= 5:
        bitwise(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    elif mode == "full-cpu":
        full_cpu(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
