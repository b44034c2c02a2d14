"""CTest examples.torch_gpt_compare_worker: examples/torch_trainer/compare_worker.py on the CPU at
compare.py's tiny CPU size, one process per case, all started at once:

  - the batches of compare_data.write_data are gpt.synthetic_batch's bits, and a worker given
    them (--data) trains to the same losses, bitwise, as one that builds them (strata-cpu and
    torch), reporting the same digest; a file built for another batch is refused, naming it;
  - the JSON parses strictly (no NaN/Infinity) and has the start-up phases, the learning-rate
    warm-up (recorded and applied: strata's losses within 1e-5 of torch's), the memory figures
    (GPU ones null on the CPU; strata's pinned bytes 0 on the host backend, with the note);
  - a non-finite loss (--poison-step) is null with non_finite true, the run "failed" naming the
    step, exit 1, training stopped there;
  - --hang-after-json: the final JSON is written (the progress file beside it, status
    "running", removed), then the process stays alive (killed here);
  - fsdp2 and fsdp2-nooffload are skipped with the reason (the torch they need, or the CPU);
  - the test hooks are hidden from --help.
"""

import json
import math
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                        "torch_trainer")
WORKER = os.path.join(EXAMPLES, "compare_worker.py")
sys.path.insert(0, EXAMPLES)

import compare_data  # noqa: E402
import gpt  # noqa: E402

SIZE = dict(vocab=64, seq_len=64, d_model=64, heads=4, layers=2)  # compare.py DEFAULTS["cpu"]
BATCH, STEPS = 8, 3
CONFIG = gpt.GPTConfig(tied=False, **SIZE)


def reject(name):
    raise ValueError(f"not strict JSON: {name}")


def read(path):
    with open(path) as f:
        return json.loads(f.read(), parse_constant=reject)


def worker_env():
    env = dict(os.environ, STRATA_BACKEND="host", STRATA_GPU_BYTES="64MiB",
               STRATA_CPU_BYTES="64MiB", PYTHONDONTWRITEBYTECODE="1")
    for key in ("STRATA_NVME_PATHS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                "MASTER_PORT"):
        env.pop(key, None)
    return env


def command(system, out, *extra, batch=BATCH):
    size = [f"--{k.replace('_', '-')}={v}" for k, v in SIZE.items()]
    return [sys.executable, WORKER, f"--system={system}", "--device=cpu", *size,
            f"--batch={batch}", f"--steps={STEPS}", f"--json={out}", "--max-live-bytes=1MiB",
            "--prefetch-bytes=64KiB", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case's process, started together; {case: (returncode, output, json path)}."""
    work = tmp_path_factory.mktemp("compare-worker")
    data = str(work / "batches.pt")
    compare_data.write_data(data, CONFIG, STEPS, BATCH)
    other = str(work / "batches-4.pt")
    compare_data.write_data(other, CONFIG, STEPS, 4)
    cases = {
        "strata-data": ("strata-cpu", f"--data={data}"),
        "strata": ("strata-cpu",),
        "torch": ("torch",),
        "torch-data-hang": ("torch", f"--data={data}", "--hang-after-json"),
        "poison": ("strata-cpu", f"--data={data}", "--poison-step=2"),
        "bad-data": ("torch", f"--data={other}"),
        "fsdp2": ("fsdp2",),
        "fsdp2-nooffload": ("fsdp2-nooffload",),
    }
    procs, results = {}, {"_data": data}
    env = worker_env()
    try:
        for case, (system, *extra) in cases.items():
            out = str(work / f"{case}.json")
            procs[case] = (subprocess.Popen(command(system, out, *extra), env=env, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
                           out)
        # The hanging one: its final JSON appears, and it is still alive after.
        proc, out = procs.pop("torch-data-hang")
        deadline = time.monotonic() + 90
        final = None
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(out):  # written once, whole (renamed into place)
                final = read(out)
                break
            try:  # the progress file, while it lasts
                assert read(out + ".partial")["status"] == "running"
            except FileNotFoundError:
                pass
            time.sleep(0.1)
        time.sleep(1.0)
        alive = proc.poll() is None
        assert not os.path.exists(out + ".partial")
        proc.kill()
        output = proc.communicate(timeout=30)[0]
        results["torch-data-hang"] = (alive, final, output)
        for case, (proc, out) in procs.items():
            output = proc.communicate(timeout=120)[0]
            results[case] = (proc.returncode, output, out)
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def ok(runs, case):
    rc, output, path = runs[case]
    assert rc == 0, f"{case} exited {rc}:\n{output}"
    r = read(path)
    assert r["status"] == "ok", r
    return r


def test_write_data_is_synthetic_batch_bitwise(runs):
    pairs, meta = compare_data.load_data(runs["_data"], CONFIG, STEPS, BATCH)
    assert meta["steps"] == STEPS and meta["batch"] == BATCH and meta["seed"] == 7
    for step, (x, y) in enumerate(pairs, 1):
        want_x, want_y = gpt.synthetic_batch(CONFIG, step, BATCH, seed=7)
        assert x.dtype == torch.int64 and torch.equal(x, want_x) and torch.equal(y, want_y)
    with pytest.raises(ValueError, match="holds 3 steps, this run takes 5"):
        compare_data.load_data(runs["_data"], CONFIG, 5, BATCH)


def test_data_file_gives_the_same_losses_bitwise(runs):
    for with_data, without in (("strata-data", "strata"), ("torch-data-hang", "torch")):
        a = ok(runs, without)
        b = runs["torch-data-hang"][1] if with_data == "torch-data-hang" else ok(runs, with_data)
        assert b is not None and b["status"] == "ok", b
        assert [s["loss"] for s in b["steps"]] == [s["loss"] for s in a["steps"]]
        assert b["data"]["source"] == "file" and a["data"]["source"] == "generated"
        assert b["data"]["digest"] == a["data"]["digest"]
    rc, output, path = runs["bad-data"]
    r = read(path)
    assert rc == 1 and r["status"] == "failed", (rc, output)
    assert "built for batch 4, this run has 8" in r["error"]


def test_json_fields_schedule_and_memory(runs):
    strata, torch_run = ok(runs, "strata"), ok(runs, "torch")
    lrs = [1.5e-3, 3e-3, 3e-3]  # --warmup-steps=2 (the default) to the peak 3e-3
    for r in (strata, torch_run):
        assert r["lr_schedule"] == {"kind": "linear-warmup", "peak": 3e-3, "warmup_steps": 2,
                                    "lrs": lrs}
        assert [s["lr"] for s in r["steps"]] == pytest.approx(lrs, rel=1e-6)
        start = r["startup"]
        for key in ("python_s", "import_torch_s", "data_s", "build_s", "first_step_s",
                    "to_first_step_s"):
            assert isinstance(start[key], float) and start[key] >= 0, (key, start)
        assert start["to_first_step_s"] >= start["build_s"] + start["first_step_s"]
        for s in r["steps"]:
            assert s["non_finite"] is False and math.isfinite(s["loss"])
            for key in ("seconds", "forward_s", "backward_s", "optimizer_s"):
                assert s[key] > 0, (key, s)
            assert s["gpu_free_bytes"] is None
        for key in ("torch_max_reserved_bytes", "gpu_total_bytes", "gpu_free_start_bytes",
                    "gpu_free_min_bytes", "gpu_other_bytes", "gpu_context_bytes"):
            assert key in r and r[key] is None, key
        assert r["rss_peak_bytes"] > 0 and "non_finite_fields" not in r
    assert set(strata["startup"]["build_parts"]) >= {"runtime_s", "communicator_s", "shard_s"}
    assert strata["startup"]["import_strata_s"] >= 0
    assert set(torch_run["startup"]["build_parts"]) == {"materialize_s", "optimizer_s"}
    assert strata["pinned_bytes"] == 0 and "host backend" in strata["pinned_note"]
    # STRATA_GPU_BYTES less the bounce buffer compaction keeps (1/64).
    assert 0 < strata["arena_peak_bytes"] < strata["arena_capacity_bytes"] <= 64 << 20
    assert all(s["exposed_transfer_s"] >= 0 and s["skipped"] is False for s in strata["steps"])
    assert all(s["exposed_transfer_s"] is None for s in torch_run["steps"])
    # The schedule reached both optimizers: the same losses within compare.py's CPU tolerance.
    for a, b in zip(strata["steps"], torch_run["steps"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_non_finite_loss_fails_the_run_with_valid_json(runs):
    rc, output, path = runs["poison"]
    r = read(path)
    assert rc == 1, output
    assert r["status"] == "failed" and r["error"].startswith("non-finite loss at step 2"), r
    assert len(r["steps"]) == 2  # training stopped there
    first, second = r["steps"]
    assert first["non_finite"] is False and math.isfinite(first["loss"])
    assert second["non_finite"] is True and second["loss"] is None
    assert second["skipped"] is True  # strata's step saw the overflow and skipped


def test_hang_after_json_keeps_the_process_with_its_json_written(runs):
    alive, final, output = runs["torch-data-hang"]
    assert final is not None and final["status"] == "ok", output
    assert alive, f"the worker left instead of hanging:\n{output}"
    assert len(final["steps"]) == STEPS


def test_fsdp2_systems_are_skipped_on_the_cpu_with_the_reason(runs):
    old = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 4)
    for case, what in (("fsdp2", "FSDP2 (fully_shard with CPUOffloadPolicy, and fused CPU "
                                 "AdamW) needs torch >= 2.4"),
                       ("fsdp2-nooffload", "FSDP2 (fully_shard without offload, and fused CUDA "
                                           "AdamW) needs torch >= 2.4")):
        rc, output, path = runs[case]
        r = read(path)
        assert rc == 4 and r["status"] == "skipped", (rc, output)
        if old:
            assert r["skipped"].startswith(what + "; this torch is "), r["skipped"]
        else:
            assert r["skipped"].endswith("trains on a CUDA device; this run is on the CPU")


def test_hooks_are_hidden_from_help():
    out = subprocess.run([sys.executable, WORKER, "--help"], capture_output=True, text=True,
                         timeout=60, env=worker_env())
    assert out.returncode == 0 and "--data" in out.stdout and "fsdp2-nooffload" in out.stdout
    for hook in ("--perturb", "--poison-step", "--hang-after-json"):
        assert hook not in out.stdout
