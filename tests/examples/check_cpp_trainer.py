#!/usr/bin/env python3
"""Runs examples/cpp_trainer and checks what it reports (standard library only).

  check_cpp_trainer.py json STRATA_RUN TRAINER RANKS STAGE [TRAINER ARGS...]
      Runs the trainer with --json=- (under `STRATA_RUN -n RANKS`, or alone when STRATA_RUN is
      -) and checks the document: stdout holds exactly one JSON object (only rank 0 writes; the
      human report goes to stderr and ends with PASS), every field with its type, one loss per
      step, the model-state bytes by tier adding up to the total and less than an unpartitioned
      copy of the model states, and at stages 1 and 2 the communication of one step: a
      reduce-scatter and an all-gather of the padded parameters (2 x 4 bytes x elements) plus
      the small statistics all-reduce.

  check_cpp_trainer.py dead-rank TRAINER
      Starts two ranks of --zero-stage=2 by hand (the launch variables, a free port), kills
      rank 1 once rank 0 has started training, and checks that rank 0 exits 1 within the
      communicator's timeout with one `cpp_trainer: ` line carrying the Communicator's message
      naming rank 1 (beside the runtime's own `strata: ` warnings): a dead rank is an error,
      not a hang.

The environment (STRATA_BACKEND, STRATA_GPU_BYTES, ...) is passed on to the trainer."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

# The model: 16 -> 256 -> 256 -> 256 -> 4, weights and biases.
LAYERS = [(16, 256), (256, 256), (256, 256), (256, 4)]
ELEMENTS = sum(i * o + o for i, o in LAYERS)
NUMBER = (int, float)  # JSON writes 0.05, 1 and 1e-07 alike
FIELDS = {"ranks": int, "stage": int, "steps": int, "accumulation": int, "losses": list,
          "final_loss": NUMBER, "max_loss": NUMBER, "max_weight_difference": NUMBER,
          "tolerance": NUMBER, "max_replica_difference": NUMBER,
          "model_state_bytes_per_rank": dict, "gradient_bucket_bytes_per_rank": int,
          "comm_bytes_per_step": int, "bucket_bytes": int, "groups": int, "states": str,
          "bytes_moved": int, "passed": bool}


def check_json(strata_run, trainer, ranks, stage, extra):
    launcher = [] if strata_run == "-" else [strata_run, "-n", str(ranks)]
    args = [*launcher, trainer, f"--zero-stage={stage}", *extra, "--json=-"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=240)
    print(run.stderr, end="")
    if run.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {run.returncode}")
    assert run.stderr.endswith("\nPASS\n"), "the human report (stderr) does not end with PASS"
    doc = json.loads(run.stdout)  # fails if another rank also wrote to stdout
    print(json.dumps(doc, indent=2))
    for field, kind in FIELDS.items():
        assert field in doc, f"field '{field}' missing"
        value = doc[field]
        assert isinstance(value, kind) and (kind is bool or not isinstance(value, bool)), \
            f"'{field}' is {value!r}, not {kind}"
    assert set(doc) == set(FIELDS), f"unexpected fields: {set(doc) - set(FIELDS)}"
    steps = doc["steps"]
    assert doc["ranks"] == ranks and doc["stage"] == stage, doc
    assert len(doc["losses"]) == steps, f"{len(doc['losses'])} losses for {steps} steps"
    assert all(isinstance(x, NUMBER) and x > 0 for x in doc["losses"]), doc["losses"]
    assert doc["final_loss"] == doc["losses"][-1]
    assert doc["final_loss"] < doc["max_loss"], doc["final_loss"]
    assert 0 <= doc["max_weight_difference"] < doc["tolerance"], doc["max_weight_difference"]
    assert doc["max_replica_difference"] == 0, doc["max_replica_difference"]
    assert doc["passed"] is True
    assert doc["bytes_moved"] > 0

    states = doc["model_state_bytes_per_rank"]
    assert set(states) == {"gpu", "cpu", "nvme", "total"}, states
    assert all(isinstance(v, int) and v >= 0 for v in states.values()), states
    assert states["total"] == states["gpu"] + states["cpu"] + states["nvme"], states
    # Per element: fp32 parameters and gradients (4 + 4 bytes), master and moments (12 bytes);
    # stage 0 also has the optimizer's CPU copy of the gradient (4 bytes). States on NVMe count
    # as the swap space holds them: two slots of 12 bytes per element (rounded up to chunks).
    if doc["states"] == "nvme":
        assert states["nvme"] >= 2 * 12 * ELEMENTS // ranks, states
    else:
        assert doc["states"] == "cpu" and states["nvme"] == 0, states
    unpartitioned = (4 + 4 + 4 + 12) * ELEMENTS
    if stage == 0:
        assert states["gpu"] == 0 and states["cpu"] == (4 + 4 + 4) * ELEMENTS + (
            12 * ELEMENTS if doc["states"] == "cpu" else 0), states
        assert doc["comm_bytes_per_step"] == 0 and doc["bucket_bytes"] == 0
        assert doc["groups"] == 0 and doc["gradient_bucket_bytes_per_rank"] == 0
    else:
        if doc["states"] == "cpu":
            assert states["total"] < unpartitioned, (states, unpartitioned)
        assert doc["bucket_bytes"] > 0 and doc["groups"] >= 2, doc
        assert (doc["gradient_bucket_bytes_per_rank"] > 0) == (stage == 2), doc
        # Reduce-scatter (its full input) and all-gather (its output) of every group: at least
        # 2 x 4 bytes per element, at most that with each group padded by ranks x 64 elements,
        # plus the statistics all-reduce (a few bytes).
        low = 2 * 4 * ELEMENTS
        high = 2 * 4 * (ELEMENTS + doc["groups"] * ranks * 64) + 1024
        assert low <= doc["comm_bytes_per_step"] <= high, (doc["comm_bytes_per_step"], low, high)
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_dead_rank(trainer):
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("STRATA_COMM_TIMEOUT", "30s")
        procs.append(subprocess.Popen(
            [trainer, "--zero-stage=2", "--states=cpu", "--steps=1000000"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    rank0, rank1 = procs
    try:
        header = rank0.stdout.readline()  # printed once the engine exists: training starts
        print(header, end="")
        assert "ZeRO stage 2 on 2 rank(s)" in header, f"rank 0 did not start: {header!r}"
        time.sleep(1.0)
        assert rank1.poll() is None, "rank 1 ended on its own"
        rank1.send_signal(signal.SIGKILL)
        rank1.wait(timeout=30)
        out, err = rank0.communicate(timeout=90)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    print(out, end="")
    print(err, end="")
    assert rank0.returncode == 1, f"rank 0 exited {rank0.returncode}, not 1"
    # One error line of the trainer's; the runtime may add its own "strata: " warnings.
    lines = [line for line in err.splitlines() if line]
    ours = [line for line in lines if line.startswith("cpp_trainer: ")]
    assert len(ours) == 1, lines
    assert all(line.startswith("strata: ") for line in lines if line not in ours), lines
    assert "Rank(s) at fault: 1" in ours[0], ours[0]
    assert "PASS" not in out and "PASS" not in err
    return 0


def main():
    mode = sys.argv[1]
    if mode == "json":
        return check_json(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                          sys.argv[6:])
    if mode == "dead-rank":
        return check_dead_rank(sys.argv[2])
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main())
