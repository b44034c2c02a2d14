#!/usr/bin/env python3
"""Runs examples/cpp_trainer and checks what it reports (standard library only).

  check_cpp_trainer.py json STRATA_RUN TRAINER RANKS STAGE [TRAINER ARGS...]
      Runs the trainer with --json=- (under `STRATA_RUN -n RANKS`, or alone when STRATA_RUN is
      -) and checks the document: stdout holds exactly one JSON object (only rank 0 writes; the
      human report goes to stderr and ends with PASS), every field with its type, one loss per
      step, the model-state bytes by tier adding up to the total and less than an unpartitioned
      copy of the model states, and at stages 1 and 2 the communication of one step: a
      reduce-scatter and an all-gather of the padded parameters (2 x 4 bytes x elements) plus
      the small statistics all-reduce. At stage 3 also the stage-3 fields: the options echoed,
      the gathered peak within --max-live-bytes, the fetch counters consistent, the model-state
      bytes (4+4+12) bytes per partitioned element / RANKS plus the whole persistent ones, the
      shards in --param-home's tier, and between 2 and 3 x 4 bytes x elements communicated.

      Every run also reports what a training step moved of the optimizer states on NVMe: with
      the states there, the reads and writes of a step are the state bytes (12 per element of
      the rank's slice) plus at most one I/O block (STRATA_IO_BLOCK) of rounding per tensor the
      optimizer steps; with the states in the CPU tier, nothing.

  check_cpp_trainer.py readme TRAINER NVME_DIR [TRAINER ARGS...]
      The README's first command with default settings: every STRATA_* variable removed but
      STRATA_NVME_PATHS=NVME_DIR (and STRATA_NVME_BYTES, so that CI's disk is not asked for the
      default 8 GiB), no flag but TRAINER ARGS: it must pass, with the GPU arena the example
      sizes itself (smaller than the model's parameters and gradients), the states on NVMe and
      a step's NVMe traffic within the bound above. Then the same without STRATA_NVME_PATHS:
      the states go to the CPU tier, and it passes too.

  check_cpp_trainer.py json-tight STRATA_RUN TRAINER RANKS 3 [TRAINER ARGS...]
      As json, for a --max-live-bytes of the largest gathered group: the gathered bytes reach
      the limit and never pass it, and the limit made the engine drop what it would have kept or
      prefetched: most gathers are on demand, and at most one group a step (the one at the turn
      from forward to backward) is reused, where the default limit keeps two.

  check_cpp_trainer.py stage3-below-stage2 STRATA_RUN TRAINER RANKS GPU_BYTES_2 GPU_BYTES_3
                       [TRAINER ARGS...]
      Runs the json check at stage 2 (STRATA_GPU_BYTES=GPU_BYTES_2) and at stage 3 (GPU_BYTES_3)
      with the same arguments and checks that stage 3's model-state bytes per rank are below
      stage 2's: the parameters are partitioned too.

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
          "bytes_moved": int, "passed": bool, "weights_checksum": str,
          "gpu_tier_peak_bytes": int, "backend": str, "gpu_arena_bytes": int,
          "optimizer_state_bytes": int, "nvme_read_bytes_per_step": int,
          "nvme_written_bytes_per_step": int, "nvme_state_ratio": NUMBER,
          "overlap_step": bool, "optimizer": dict}
STAGE3_FIELDS = {"param_home": str, "prefetch_bytes": int, "max_live_bytes": int,
                 "persist_below_bytes": int, "reuse_window_bytes": int,
                 "partitioned_groups": int, "gathered_peak_bytes": int,
                 "exposed_comm_seconds": NUMBER, "prefetch_late": int, "fetch": dict,
                 "hpz_node_ranks": int}
FETCH_FIELDS = {"fetches", "gathers_on_demand", "gathers_prefetched", "reuses",
                "gathers_dropped_unused", "order_changes", "global_gather_bytes",
                "node_gather_bytes"}


def check_json(strata_run, trainer, ranks, stage, extra, env=None, base_env=None):
    launcher = [] if strata_run == "-" else [strata_run, "-n", str(ranks)]
    stage_flag = [f"--zero-stage={stage}"] if stage else []  # 0 is the default
    args = [*launcher, trainer, *stage_flag, *extra, "--json=-"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=240,
                         env=dict(os.environ if base_env is None else base_env, **(env or {})))
    print(run.stderr, end="")
    if run.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {run.returncode}")
    assert run.stderr.endswith("\nPASS\n"), "the human report (stderr) does not end with PASS"
    doc = json.loads(run.stdout)  # fails if another rank also wrote to stdout
    print(json.dumps(doc, indent=2))
    fields = dict(FIELDS, **(STAGE3_FIELDS if stage == 3 else {}))
    for field, kind in fields.items():
        assert field in doc, f"field '{field}' missing"
        value = doc[field]
        assert isinstance(value, kind) and (kind is bool or not isinstance(value, bool)), \
            f"'{field}' is {value!r}, not {kind}"
    assert set(doc) == set(fields), f"unexpected fields: {set(doc) - set(fields)}"
    steps = doc["steps"]
    assert doc["ranks"] == ranks and doc["stage"] == stage, doc
    assert len(doc["losses"]) == steps, f"{len(doc['losses'])} losses for {steps} steps"
    assert all(isinstance(x, NUMBER) and x > 0 for x in doc["losses"]), doc["losses"]
    # Per step, the optimizer time exposed after the last gradient and the elements stepped
    # early (none without --overlap-step), and the steps whose early work was rolled back.
    opt = doc["optimizer"]
    assert set(opt) == {"exposed_seconds", "early_elements", "rollbacks"}, opt
    assert len(opt["exposed_seconds"]) == steps and len(opt["early_elements"]) == steps, opt
    assert all(isinstance(x, NUMBER) and x >= 0 for x in opt["exposed_seconds"]), opt
    assert all(isinstance(x, int) and 0 <= x <= ELEMENTS for x in opt["early_elements"]), opt
    assert isinstance(opt["rollbacks"], int) and 0 <= opt["rollbacks"] <= steps, opt
    if not doc["overlap_step"]:
        assert opt["rollbacks"] == 0 and not any(opt["early_elements"]), opt
    assert doc["final_loss"] == doc["losses"][-1]
    assert doc["final_loss"] < doc["max_loss"], doc["final_loss"]
    assert 0 <= doc["max_weight_difference"] < doc["tolerance"], doc["max_weight_difference"]
    assert doc["max_replica_difference"] == 0, doc["max_replica_difference"]
    assert doc["passed"] is True
    assert doc["backend"] in ("host", "cuda"), doc["backend"]
    assert doc["gpu_arena_bytes"] > 0, doc
    if doc["backend"] == "host":  # on cuda the example computes on CPU-tier copies
        assert doc["bytes_moved"] > 0
    check_state_traffic(doc, ranks, stage)

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
        # Only stage 3's shards homed on NVMe are there then.
        assert doc["states"] == "cpu", doc["states"]
        assert (states["nvme"] == 0) == (doc.get("param_home") != "nvme"), states
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
        assert (doc["gradient_bucket_bytes_per_rank"] > 0) == (stage >= 2), doc
        # Reduce-scatter (its full input) and all-gather (its output) of every group: at least
        # 2 x 4 bytes per element, at most that with each group padded by ranks x 64 elements,
        # plus the statistics all-reduce (a few bytes). Stage 3 gathers the partitioned groups
        # in forward and again in backward (less the ones kept between): up to 3 x 4 bytes.
        low = 2 * 4 * ELEMENTS
        high = (3 if stage == 3 else 2) * 4 * (ELEMENTS + doc["groups"] * ranks * 64) + 1024
        assert low <= doc["comm_bytes_per_step"] <= high, (doc["comm_bytes_per_step"], low, high)
    if stage == 3:
        check_stage3(doc, ranks, extra)
    return doc


def check_state_traffic(doc, ranks, stage, io_block=1 << 20):
    """A step's NVMe reads and writes of the optimizer states, against the state bytes."""
    state = doc["optimizer_state_bytes"]
    # 12 bytes per element of this rank's slice (stages 1-3: each group padded by up to
    # RANKS x 64 elements).
    padding = 0 if stage == 0 else doc["groups"] * ranks * 64
    assert 12 * ELEMENTS // ranks <= state <= 12 * (ELEMENTS // ranks + padding), (state, ranks)
    read, written = doc["nvme_read_bytes_per_step"], doc["nvme_written_bytes_per_step"]
    ratio = doc["nvme_state_ratio"]
    print(f"optimizer states {state} bytes; a step read {read}, wrote {written}: ratio {ratio}")
    if doc["states"] != "nvme":
        assert read == 0 and written == 0 and ratio == 0, doc
        return
    # Every parameter gets a gradient every step: all states are read and written once, each
    # tensor the optimizer steps (stage 0: a layer; stages 1-3: a flat group's slice) rounded
    # up by less than an I/O block.
    tensors = len(LAYERS) if stage == 0 else doc["groups"]
    bound = state + tensors * io_block
    assert state <= read <= bound and state <= written <= bound, (read, written, state, bound)
    assert abs(ratio - max(read, written) / state) < 1e-3, ratio


def check_readme(trainer, nvme_dir, extra):
    """The README's command with the defaults: only the NVMe directory set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    with_nvme = {"STRATA_NVME_PATHS": nvme_dir, "STRATA_NVME_BYTES": "256MiB"}
    doc = check_json("-", trainer, 1, 0, extra, with_nvme, clean)
    assert doc["states"] == "nvme", doc["states"]
    assert doc["gpu_arena_bytes"] < 2 * 4 * ELEMENTS, doc["gpu_arena_bytes"]
    print(f"states on NVMe: a step moved {doc['nvme_state_ratio']:.3f}x the state bytes")
    doc = check_json("-", trainer, 1, 0, extra, {}, clean)
    assert doc["states"] == "cpu", doc["states"]
    return 0


def check_stage3(doc, ranks, extra):
    # The options echoed: the flags given, else the trainer's defaults.
    given = dict(a[2:].split("=", 1) for a in extra if a.startswith("--") and "=" in a)
    defaults = {"param-home": "cpu", "prefetch-bytes": 256 << 10, "max-live-bytes": 640 << 10,
                "persist-below-bytes": 2 << 10, "reuse-window-bytes": 256 << 10}
    for flag, default in defaults.items():
        want = given.get(flag, default)
        if isinstance(default, int) and flag in given:
            want = size(want)
        assert doc[flag.replace("-", "_")] == want, (flag, doc[flag.replace("-", "_")], want)
    # The parameters below --persist-below-bytes stay whole (fp32: 4 bytes an element).
    counts = [c for i, o in LAYERS for c in (i * o, o)]
    whole = sum(c for c in counts if 4 * c < doc["persist_below_bytes"])
    parted = ELEMENTS - whole
    assert 1 <= doc["partitioned_groups"] <= doc["groups"], doc
    assert (doc["partitioned_groups"] < doc["groups"]) == (whole > 0), doc

    assert 0 < doc["gathered_peak_bytes"] <= doc["max_live_bytes"], doc
    assert doc["exposed_comm_seconds"] >= 0, doc
    fetch = doc["fetch"]
    assert set(fetch) == FETCH_FIELDS and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in fetch.values()), fetch
    # Every step uses every partitioned group in forward and again in backward; a use finds its
    # group gathered (prefetched or kept) or gathers it; the last step prefetches for a next one.
    uses = 2 * doc["partitioned_groups"] * doc["steps"] * doc["accumulation"]
    assert fetch["fetches"] >= uses, (fetch, uses)
    gathers = fetch["gathers_on_demand"] + fetch["gathers_prefetched"]
    assert fetch["fetches"] <= gathers + fetch["reuses"], fetch
    assert doc["prefetch_late"] <= fetch["gathers_prefetched"], doc
    assert fetch["gathers_dropped_unused"] <= fetch["gathers_prefetched"], fetch
    assert fetch["order_changes"] == 0, fetch  # the trainer's order never changes
    if doc["prefetch_bytes"] == 0:
        assert fetch["gathers_prefetched"] == 0, fetch
    if doc["reuse_window_bytes"] == 0:
        assert fetch["reuses"] == 0, fetch
    # One node here (hpZ off): every gather is over every rank.
    assert doc["hpz_node_ranks"] == 0 and fetch["node_gather_bytes"] == 0, doc
    assert fetch["global_gather_bytes"] > 0, fetch

    # Model states per rank: a 1/RANKS shard of each partitioned parameter with its gradient
    # and (CPU) optimizer states, 4 + 4 + 12 bytes an element; the persistent parameters whole
    # (4 bytes) beside their shards of gradient and states (4 + 12). Each of the groups may pad
    # by up to RANKS x 64 elements.
    states = doc["model_state_bytes_per_rank"]
    home = doc["param_home"]
    assert states[home] >= 4 * parted // ranks, (home, states, parted)
    if doc["states"] == "cpu":
        formula = (20 * parted + 16 * whole) / ranks + 4 * whole
        slack = 24 * doc["groups"] * ranks * 64
        assert abs(states["total"] - formula) <= slack, (states, formula, slack)


def size(text):
    """The trainer's size flags: a byte count with an optional binary unit (as the tests give)."""
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * scale)
    return int(text)


def check_json_tight(strata_run, trainer, ranks, stage, extra):
    assert stage == 3, "json-tight is a stage-3 check"
    doc = check_json(strata_run, trainer, ranks, stage, extra)
    fetch = doc["fetch"]
    # The limit is the largest group: gathering it filled the limit exactly.
    assert doc["gathered_peak_bytes"] == doc["max_live_bytes"], doc
    assert fetch["gathers_on_demand"] > fetch["gathers_prefetched"], fetch
    assert fetch["reuses"] <= doc["steps"] * doc["accumulation"], fetch
    return 0


def check_stage3_below_stage2(strata_run, trainer, ranks, gpu2, gpu3, extra):
    totals = {}
    for stage, gpu in ((2, gpu2), (3, gpu3)):
        doc = check_json(strata_run, trainer, ranks, stage, extra, {"STRATA_GPU_BYTES": gpu})
        totals[stage] = doc["model_state_bytes_per_rank"]["total"]
    print(f"model-state bytes per rank at {ranks} ranks: stage 2 {totals[2]}, stage 3 {totals[3]}")
    assert totals[3] < totals[2], totals
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
        check_json(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:])
        return 0
    if mode == "readme":
        return check_readme(sys.argv[2], sys.argv[3], sys.argv[4:])
    if mode == "json-tight":
        return check_json_tight(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                                sys.argv[6:])
    if mode == "stage3-below-stage2":
        return check_stage3_below_stage2(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5],
                                         sys.argv[6], sys.argv[7:])
    if mode == "dead-rank":
        return check_dead_rank(sys.argv[2])
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main())
