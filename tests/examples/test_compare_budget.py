"""CTest examples.torch_gpt_compare_budget: compare_budget.py (the bytes each system needs in
each place, what a machine offers, strata's STRATA_* sizes, the refusal before start) and
compare_search.py (the largest model by prediction, confirmed by probes).

  - units (no torch, no strata): Resources.parse and its errors; the parameter count and the
    ZeRO layout; bytes per parameter per system and place against the figures docs/bench.md
    gives; check()'s messages (the resource, needed and available bytes, what fits, the fix);
    strata_env's variables; the search's verdicts against a probe of a known limit (confirmed,
    too high with the probe below, too low, nothing fits, a failure, out of time);
  - on the host backend (compare_worker.py processes, STRATA_* from strata_env): strata-cpu with
    a small pinned budget and strata-nvme with a small NVMe budget, and strata-cpu with a small
    arena: the probe at the prediction trains one step and the probe 25% above fails with
    strata's ResourceExhaustedError (the tier's, NVMe's, the arena's limit), so the true limit
    lies between them; and the tiers' peak use (the worker's rt.stats() figures) matches need()
    within the margins stated below.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                        "torch_trainer")
WORKER = os.path.join(EXAMPLES, "compare_worker.py")
sys.path.insert(0, EXAMPLES)

import compare_budget as cb  # noqa: E402
import compare_search as cs  # noqa: E402

MiB, GiB = cb.MiB, cb.GiB
CUDA_MODEL = cb.Model(vocab=32768, seq_len=1024, d_model=2048, heads=16, layers=8)  # compare.py
BASE = cb.Resources(gpu=None, host=64 * GiB, pinned=64 * GiB)


# --- Resources ---

def test_resources_parse_overrides_and_keeps_the_rest():
    r = cb.Resources.parse("gpu=64MiB,host=1GiB,nvme=256MiB", base=BASE)
    assert (r.gpu, r.host, r.nvme) == (64 * MiB, GiB, 256 * MiB)
    assert r.pinned == GiB  # assumed "all of host": follows a given host
    assert dict(r.sources)["host"] == "given"
    r = cb.Resources.parse("pinned=1.5GiB, host = 2GiB", base=BASE)  # spaces, either order
    assert (r.pinned, r.host) == (int(1.5 * GiB), 2 * GiB)
    r2 = cb.Resources.parse("host=1GiB", base=r)  # a given pinned stays, lowered to host
    assert r2.pinned == GiB
    assert cb.Resources.parse("", base=BASE) == BASE


def test_resources_parse_errors_name_the_part():
    with pytest.raises(ValueError, match="'gpu64MiB' is not key=value with a key of gpu, host"):
        cb.Resources.parse("gpu64MiB", base=BASE)
    with pytest.raises(ValueError, match="'disk=1GiB' is not key=value"):
        cb.Resources.parse("disk=1GiB", base=BASE)
    with pytest.raises(ValueError, match="resources: host=12XB: .*not a size"):
        cb.Resources.parse("host=12XB", base=BASE)
    with pytest.raises(ValueError, match="'host' given twice"):
        cb.Resources.parse("host=1GiB,host=2GiB", base=BASE)
    with pytest.raises(ValueError, match=r"pinned=2.00 GiB is more than host=1.00 GiB"):
        cb.Resources.parse("host=1GiB,pinned=2GiB", base=BASE)


def test_sizes_parse_as_strata_does():
    import compare_sizes
    cases = {"4096": 4096, "512KiB": 512 * 1024, "64 mib": 64 * MiB, "1.5GB": 1_500_000_000,
             "2.5": 3, "1.5KiB": 1536, "40GiB": 40 * GiB}
    for text, want in cases.items():
        assert compare_sizes._parse_size_here(text) == want, text
        assert cb.parse_size(text) == want, text  # strata's where importable
    for bad in ("12XB", "0", "GiB", "1G"):
        with pytest.raises(ValueError, match="not a size"):
            compare_sizes._parse_size_here(bad)
    assert cb.parse_size(7) == 7


def test_resources_measure_reads_the_machine(tmp_path):
    r = cb.Resources.measure("cpu", nvme_path=str(tmp_path))
    available = cb.mem_available()
    assert 0 < r.host < available and r.pinned == r.host and r.gpu is None
    assert 0 <= r.nvme < os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert r.nvme_path == str(tmp_path)
    assert "MemAvailable" in dict(r.sources)["host"]
    assert "RLIMIT_MEMLOCK" in dict(r.sources)["pinned"]


# --- the model and strata's layout ---

def test_parameters_follow_gpt_py():
    # gpt.parameter_count's formula, untied: GPT-2 small (124,439,808 tied) plus its head.
    small = cb.Model(vocab=50257, seq_len=1024, d_model=768, heads=12, layers=12)
    assert small.parameters() == 124_439_808 + 50257 * 768
    assert CUDA_MODEL.parameters() == 539_185_152
    assert sum(n for _name, n in CUDA_MODEL.shapes()) == CUDA_MODEL.parameters()
    assert CUDA_MODEL.layers_for(CUDA_MODEL.with_layers(11).parameters()) == pytest.approx(11)


def test_zero_groups_pack_as_the_engine_does():
    s = cb.Settings.of(device="cuda")
    groups = cb.zero_groups(CUDA_MODEL, 2, 2, s)
    assert all(g.padded % 64 == 0 for g in groups)
    padded = sum(g.padded for g in groups)
    assert CUDA_MODEL.parameters() <= padded < CUDA_MODEL.parameters() + 64 * len(groups)
    # The embeddings (64 Mi elements each) are larger than a 32 MiB bucket: groups of their own.
    assert max(g.padded for g in groups) == 32768 * 2048
    # Biases and LayerNorms (below 128 KiB) are persistent; every matrix is partitioned.
    tiny = cb.Model(vocab=64, seq_len=64, d_model=64, heads=4, layers=2)
    assert all(g.persistent for g in cb.zero_groups(tiny, 4, 4, cb.Settings.of(device="cpu")))


# --- bytes per parameter, system and place (docs/bench.md's table) ---

def per_param(system, place, device="cuda", layers=64):
    """Bytes a parameter in `place`: the slope between two layer counts (fixed terms cancel)."""
    s = cb.Settings.of(device=device, batch=1)
    a = cb.need(system, CUDA_MODEL.with_layers(layers), device, s).get(place)
    b = cb.need(system, CUDA_MODEL.with_layers(2 * layers), device, s).get(place)
    return (b - a) / (CUDA_MODEL.with_layers(2 * layers).parameters()
                      - CUDA_MODEL.with_layers(layers).parameters())


def test_bytes_per_parameter():
    approx = lambda x: pytest.approx(x, rel=0.01)  # noqa: E731
    assert per_param("strata-cpu", "pinned") == approx(16)  # 12 states + bf16 shard + gradient
    assert per_param("strata-cpu", "nvme") == 0
    assert per_param("strata-nvme", "nvme") == approx(26)  # 24 (two slots) + the bf16 shard
    assert per_param("strata-nvme", "pinned") == approx(2)  # the gradient shards
    assert per_param("strata-cpu", "pinned", "cpu") == approx(20)  # fp32 shard and gradient
    assert per_param("strata-nvme", "nvme", "cpu") == approx(28)
    # On the GPU: 16 B (fp32 parameter, gradient, two moments), autocast's bf16 copies of the
    # weights (2 B), activations at batch 1 (~1.6 B a parameter at this width), 10% allocator.
    assert per_param("torch", "gpu") == pytest.approx(1.1 * (16 + 2 + 1.6), rel=0.02)
    assert per_param("fsdp2-nooffload", "gpu") == pytest.approx(1.1 * (16 + 1.4), rel=0.02)
    assert per_param("fsdp2", "gpu") == pytest.approx(1.1 * 1.4, rel=0.02)  # activations only
    assert per_param("strata-cpu", "gpu") == pytest.approx(1.1 * 1.4, rel=0.02)
    assert 8 <= per_param("fsdp2", "pinned") <= 16  # fp32 params + grads, powers of two
    assert per_param("fsdp2", "host") == pytest.approx(8 + per_param("fsdp2", "pinned"), rel=0.01)


def test_the_old_nvme_budget_is_short():
    # Issue 35: 20 B a parameter + 256 MiB was budgeted for the 537 M comparison's NVMe states.
    n = cb.need("strata-nvme", CUDA_MODEL, "cuda")
    assert n.nvme > 20 * CUDA_MODEL.parameters() + 256 * MiB
    assert n.nvme == pytest.approx(26 * CUDA_MODEL.parameters(), rel=0.02)


def test_need_items_add_up_and_name_their_reason():
    n = cb.need("strata-cpu", CUDA_MODEL, "cuda", {"batch": 8})
    for place in ("gpu", "pinned", "nvme"):
        assert n.get(place) == sum(b for p, _w, b in n.items if p == place)
    assert n.host == n.pinned + sum(b for p, _w, b in n.items if p == "host")
    whats = " ".join(w for _p, w, _b in n.items)
    assert "fp32 master and two Adam moments (12 B a parameter)" in whats
    assert "STRATA_GPU_BYTES" in whats and "activations of batch 8" in whats
    with pytest.raises(ValueError, match="fsdp2 trains on a CUDA device only"):
        cb.need("fsdp2", CUDA_MODEL, "cpu")
    with pytest.raises(ValueError, match="no system 'deepspeed': use one of strata-cpu"):
        cb.need("deepspeed", CUDA_MODEL, "cuda")


def test_activations_grow_with_batch_and_layers_and_shrink_with_sdpa():
    one = cb.activation_bytes(CUDA_MODEL, 1, "bf16", True)
    assert cb.activation_bytes(CUDA_MODEL, 2, "bf16", True) == pytest.approx(2 * one, rel=0.01)
    per_layer = (cb.activation_bytes(CUDA_MODEL.with_layers(9), 1, "bf16", True)
                 - cb.activation_bytes(CUDA_MODEL, 1, "bf16", True))
    assert per_layer == 34 * 1024 * 2048 + 4 * 16 * 1024  # 17 x B x T x d bf16 + the LSE
    assert cb.activation_bytes(CUDA_MODEL, 1, "bf16", False) > one  # the T x T softmax


# --- check(): the refusal before start ---

def test_check_names_resource_bytes_what_fits_and_fix():
    res = BASE.replace(gpu=80 * GiB, host=32 * GiB, pinned=4 * GiB)
    why = cb.check("strata-cpu", CUDA_MODEL, "cuda", res)
    fit = cb.largest_layers("strata-cpu", CUDA_MODEL, "cuda", res)
    assert fit["bound"] == "pinned" and 0 < fit["layers"] < 8
    want = cb.fmt(cb.need("strata-cpu", CUDA_MODEL, "cuda").pinned)
    assert why.startswith(f"strata-cpu at 8 layers (539,185,152 parameters) needs {want} of "
                          "pinned host memory but 4.00 GiB is available (given); at most "
                          f"{fit['layers']} layers fit: allow more pinned memory")
    assert cb.check("strata-cpu", CUDA_MODEL, "cuda", res.replace(pinned=32 * GiB)) is None
    # Bound from both sides: the largest count fits, one more does not.
    assert cb.check("strata-cpu", CUDA_MODEL.with_layers(fit["layers"]), "cuda", res) is None
    assert cb.check("strata-cpu", CUDA_MODEL.with_layers(fit["layers"] + 1), "cuda", res)


def test_arena_usable_is_the_tier_capacity():
    # The GPU tier's capacity strata reports for STRATA_GPU_BYTES=96MiB and 24MiB (the host
    # backend's workers below), and 6 GiB's: less the bounce region, min(64 MiB, a 64th).
    assert cb.arena_usable(96 * MiB) == 99_090_432
    assert cb.arena_usable(24 * MiB) == 24_772_608
    assert cb.arena_usable(6 * GiB) == 6 * GiB - 64 * MiB


def test_check_nvme_gpu_arena_and_device():
    res = BASE.replace(gpu=80 * GiB)
    assert "strata-nvme needs an NVMe directory: give compare.py --nvme-path" in \
        cb.check("strata-nvme", CUDA_MODEL, "cuda", res)
    why = cb.check("strata-nvme", CUDA_MODEL, "cuda", res.replace(nvme=10 * GiB,
                                                                   nvme_path="/nonexistent"))
    assert "needs 13." in why and "GiB of NVMe space but 10.00 GiB is available" in why
    assert "a directory with more free space (--nvme-path)" in why
    why = cb.check("torch", CUDA_MODEL, "cuda", res.replace(gpu=8 * GiB))
    assert "of GPU memory but 8.00 GiB is available" in why
    why = cb.check("torch", CUDA_MODEL, "cuda", BASE)  # no GPU at all
    assert "of GPU memory but none is available" in why
    why = cb.check("strata-cpu", CUDA_MODEL, "cuda", res, {"gpu_bytes": "256MiB"})
    least = cb.arena_minimum(CUDA_MODEL, "cuda")
    assert (f"needs {cb.fmt(least)} of strata's GPU arena (STRATA_GPU_BYTES less its bounce "
            f"region) but 252.00 MiB is available") in why  # 256 MiB less a 64th
    assert "raise the arena (compare.py --strata-gpu-bytes)" in why
    assert cb.check("fsdp2", CUDA_MODEL, "cpu", res) == \
        "fsdp2 trains on a CUDA device only (compare_worker.py)"


def test_strata_env_sizes_the_tiers_from_the_machine():
    res = BASE.replace(host=32 * GiB, pinned=16 * GiB, nvme=40 * GiB + 12345,
                       nvme_path="/mnt/nvme")
    env = cb.strata_env("strata-cpu", CUDA_MODEL, "cuda", res)
    assert env == {"STRATA_GPU_BYTES": str(6 * GiB), "STRATA_CPU_BYTES": str(16 * GiB),
                   "STRATA_NVME_PATHS": ""}
    env = cb.strata_env("strata-nvme", CUDA_MODEL, "cuda", res)
    n = cb.need("strata-nvme", CUDA_MODEL, "cuda")
    assert env["STRATA_NVME_BYTES"] == str(40 * GiB)  # whole I/O blocks of what is usable
    assert env["STRATA_NVME_PATHS"] == "/mnt/nvme"
    assert int(env["STRATA_CPU_BYTES"]) == n.pinned // cb.CPU_TIER_STEP * cb.CPU_TIER_STEP
    assert env["STRATA_STAGING_BYTES"] == str(256 * MiB)
    # Host the tighter: the tier leaves the worker's other host memory.
    tight = res.replace(host=4 * GiB, pinned=4 * GiB)
    other = cb.need("strata-cpu", CUDA_MODEL, "cuda")
    assert int(cb.strata_env("strata-cpu", CUDA_MODEL, "cuda", tight)["STRATA_CPU_BYTES"]) <= \
        4 * GiB - (other.host - other.pinned)
    with pytest.raises(ValueError, match="not a strata system"):
        cb.strata_env("torch", CUDA_MODEL, "cuda", res)
    with pytest.raises(ValueError, match="strata-nvme needs an NVMe directory"):
        cb.strata_env("strata-nvme", CUDA_MODEL, "cuda", BASE)


def test_settings_of_compare_args():
    args = argparse.Namespace(batch=8, strata_gpu_bytes="6GiB", max_live_bytes="2GiB",
                              prefetch_bytes="256MiB", search_max_layers=256, device="cuda",
                              layers=8)  # compare.py's names
    s = cb.Settings.of(args, "cuda", batch=1)
    assert (s.batch, s.gpu_bytes, s.max_live_bytes, s.max_layers) == (1, 6 * GiB, 2 * GiB, 256)
    assert s.fused_attention and cb.Settings.of(None, "cpu").gpu_bytes == 64 * MiB


# --- the search's logic, against a probe of a known limit ---

def known_limit_probe(limit, calls, status_above="oom"):
    def probe(system, layers, limit_s):
        calls.append((layers, limit_s))
        if layers <= limit:
            return {"status": "ok", "seconds": 0.1}
        return {"status": status_above, "error": "ResourceExhaustedError: the tier is full",
                "seconds": 0.1}
    return probe


def search(limit, res, status_above="oom", budget_s=100.0):
    calls, lines = [], []
    out = cs.largest("strata-cpu", CUDA_MODEL, "cuda", res, {"batch": 1},
                     known_limit_probe(limit, calls, status_above), budget_s, lines.append)
    return out, calls, lines


RES = BASE.replace(gpu=80 * GiB, host=64 * GiB, pinned=20 * GiB)


def test_search_confirmed():
    predicted = cb.largest_layers("strata-cpu", CUDA_MODEL, "cuda", RES, {"batch": 1})["layers"]
    out, calls, lines = search(predicted, RES)
    above = cs.layers_above(CUDA_MODEL, predicted)
    assert [c[0] for c in calls] == [predicted, above]
    assert CUDA_MODEL.with_layers(above).parameters() >= 1.25 * \
        CUDA_MODEL.with_layers(predicted).parameters()
    assert CUDA_MODEL.with_layers(above - 1).parameters() < 1.25 * \
        CUDA_MODEL.with_layers(predicted).parameters()
    assert all(limit_s == cs.PROBE_LIMIT_S for _l, limit_s in calls)
    assert out["verdict"] == "confirmed" and not out["prediction_wrong"]
    assert out["bound"] == "pinned" and out["bound_bytes"] > out["available"] == 20 * GiB
    assert (out["confirmed_layers"], out["first_not_fitting_layers"]) == (predicted, above)
    assert [p["role"] for p in out["probes"]] == ["prediction", "above"]
    assert out["probes"][1]["why"] == "ResourceExhaustedError: the tier is full"
    assert f"predicted {predicted} layers" in lines[0] and "bound by pinned" in lines[0]
    assert out["message"].endswith(f"{predicted} layers trained, {above} did not fit: confirmed")
    json.dumps(out)  # the report goes into compare.py's JSON


def test_search_prediction_too_high_probes_lower_and_says_so():
    predicted = cb.largest_layers("strata-cpu", CUDA_MODEL, "cuda", RES, {"batch": 1})["layers"]
    out, calls, _ = search(predicted - 2, RES)
    below = cs.layers_below(CUDA_MODEL, predicted)
    assert [c[0] for c in calls] == [predicted, below]
    assert out["verdict"] == "prediction too high" and out["prediction_wrong"]
    assert out["confirmed_layers"] == below and out["first_not_fitting_layers"] == predicted
    assert "the model of memory is wrong (a bug)" in out["verdict_means"]


def test_search_prediction_too_low_nothing_fits_failed_and_out_of_time():
    predicted = cb.largest_layers("strata-cpu", CUDA_MODEL, "cuda", RES, {"batch": 1})["layers"]
    out, _, _ = search(10 * predicted, RES)
    assert out["verdict"] == "prediction too low" and out["prediction_wrong"]
    tiny = RES.replace(pinned=GiB)
    out, calls, _ = search(0, tiny)
    assert out["predicted_layers"] == 0 and [c[0] for c in calls] == [1]
    assert out["verdict"] == "nothing fits" and out["bound"] == "pinned"
    out, _, _ = search(predicted, RES, status_above="failed")
    assert out["verdict"] == "failed"
    out, _, _ = search(predicted, RES, status_above="refused")  # the runner's pre-start check
    assert out["verdict"] == "inconclusive" and "must not be checked" in out["verdict_means"]
    out, calls, _ = search(predicted, RES, budget_s=cs.MIN_PROBE_S - 1)
    assert calls == [] and out["verdict"] == "inconclusive"
    assert out["probes"][0]["status"] == "skipped" and "not started" in out["probes"][0]["why"]

    def raising(system, layers, limit_s):
        raise RuntimeError("the runner broke")
    out = cs.largest("strata-cpu", CUDA_MODEL, "cuda", RES, {"batch": 1}, raising, 60,
                     lambda *_: None)
    assert out["verdict"] == "failed" and "the probe raised RuntimeError" in out["probes"][0]["why"]


def test_search_unavailable_starts_nothing():
    calls = []
    out = cs.largest("fsdp2", CUDA_MODEL, "cpu", RES, {"batch": 1}, known_limit_probe(9, calls),
                     60, lambda *_: None)
    assert out["verdict"] == "unavailable" and calls == []
    assert out["message"] == "fsdp2: unavailable: fsdp2 trains on a CUDA device only " \
                             "(compare_worker.py)"
    out = cs.largest("strata-nvme", CUDA_MODEL, "cuda", RES, {"batch": 1},
                     known_limit_probe(9, calls), 60, lambda *_: None)
    assert out["verdict"] == "unavailable" and calls == [] and "NVMe directory" in out["message"]


def test_search_max_layers():
    calls = []
    out = cs.largest("strata-cpu", CUDA_MODEL, "cuda", RES.replace(pinned=60 * GiB),
                     {"batch": 1, "max_layers": 4}, known_limit_probe(10**6, calls), 60,
                     lambda *_: None)
    assert out["bound"] == "max_layers" and out["verdict"] == "max_layers"
    assert [c[0] for c in calls] == [4]


# --- on the host backend: the prediction against strata ---

# A GPT whose blocks have partitioned matrices (d 128: qkv, fc and proj above 128 KiB in fp32)
# and persistent small ones, at batch 1; settings as compare.py's CPU mode, with an arena and a
# gathered-group limit that hold the one partitioned group these small blocks pack into.
HOST_MODEL = cb.Model(vocab=64, seq_len=32, d_model=128, heads=4, layers=1)
HOST_SETTINGS = cb.Settings.of(device="cpu", batch=1, gpu_bytes="96MiB", max_live_bytes="96MiB",
                               prefetch_bytes="64KiB", staging_bytes="8MiB", max_layers=64)
# Margins: the CPU tier's and NVMe's peak use against need() (the figures come from the same
# layout, so they agree but for what a tier adds: its block rounding; 1% and 256 KiB).
TIER_MARGIN, TIER_SLACK = 0.01, 256 * 1024


def host_backend():
    """(torch, strata) importable with the host backend, or a skip that says why."""
    why = None
    try:
        import torch  # noqa: F401
    except ImportError:
        why = "torch is not installed (Debian: apt install python3-torch)"
    try:
        import strata  # noqa: F401
    except ImportError as e:
        why = why or f"the strata module is not on PYTHONPATH ({e})"
    if why:
        print(f"SKIPPED: {why}")
        pytest.skip(why)


def worker_probe(tmp_path, model, resources, settings, results):
    """compare_search's probe: one compare_worker.py process of one step on the host backend,
    its STRATA_* from strata_env; the worker's JSON (kept in `results` by layer count)."""
    def probe(system, layers, limit_s):
        out = tmp_path / f"{system}-{layers}.json"
        env = dict(os.environ)
        env.update(cb.strata_env(system, model.with_layers(layers), "cpu", resources, settings))
        env["STRATA_BACKEND"] = "host"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (EXAMPLES, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, WORKER, f"--system={system}", "--device=cpu",
               f"--vocab={model.vocab}", f"--seq-len={model.seq_len}",
               f"--d-model={model.d_model}", f"--heads={model.heads}", f"--layers={layers}",
               f"--batch={settings.batch}", "--steps=1", f"--json={out}",
               f"--max-live-bytes={settings.max_live_bytes}",
               f"--prefetch-bytes={settings.prefetch_bytes}"]
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=limit_s)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "error": f"did not finish within {limit_s:.0f} s"}
        try:
            with open(out) as f:
                r = json.load(f)
        except (OSError, ValueError):
            r = {"status": "failed", "error": f"exited {proc.returncode} without a result: "
                                              f"{proc.stdout[-600:]}"}
        r["seconds"] = time.monotonic() - started
        r["env"] = env
        r["output"] = proc.stdout
        results[layers] = r
        return r
    return probe


def search_host(tmp_path, system, resources):
    results = {}
    out = cs.largest(system, HOST_MODEL, "cpu", resources, HOST_SETTINGS,
                     worker_probe(tmp_path, HOST_MODEL, resources, HOST_SETTINGS, results),
                     budget_s=120, say=print)
    for p in out["probes"]:
        print(f"  probe {p}")
    return out, results


def assert_between(out, results, bound, error):
    """The prediction trained, 25% above did not fit, with strata's error of the bound."""
    assert out["bound"] == bound, out
    assert [p["role"] for p in out["probes"]] == ["prediction", "above"], out["probes"]
    ok = results[out["predicted_layers"]]
    assert ok["status"] == "ok" and len(ok["steps"]) == 1, ok.get("output")
    above = results[out["probes"][1]["layers"]]
    assert above["status"] == "oom", above.get("output")
    assert "ResourceExhaustedError" in above["error"] and error in above["error"], above["error"]
    assert out["verdict"] == "confirmed" and not out["prediction_wrong"]
    return ok


def within(measured, predicted):
    return abs(measured - predicted) <= TIER_MARGIN * predicted + TIER_SLACK


def test_strata_cpu_pinned_limit_on_the_host_backend(tmp_path):
    host_backend()
    res = BASE.replace(host=8 * GiB, pinned=48 * MiB)
    out, results = search_host(tmp_path, "strata-cpu", res)
    ok = assert_between(out, results, "pinned", "cpu tier")
    assert 4 <= out["predicted_layers"] <= 16  # a limit in reach of the model's sizes
    # The CPU tier was all the machine may pin, and its peak is what need() says: the homed
    # bytes (shards, gradients, states) beside the optimizer's own pool of that tier.
    n = cb.need("strata-cpu", HOST_MODEL.with_layers(out["predicted_layers"]), "cpu",
                HOST_SETTINGS)
    assert ok["cpu_tier_bytes"] == int(ok["env"]["STRATA_CPU_BYTES"]) == 48 * MiB
    homed = sum(b for p, w, b in n.items if p == "pinned" and "own pinned pool" not in w)
    measured = ok["cpu_tier_peak_bytes"] - cb.own_pool_bytes(ok["cpu_tier_bytes"])
    print(f"strata-cpu CPU tier: homed {measured:,} measured, {homed:,} predicted")
    assert within(measured, homed)
    assert ok["nvme_peak_bytes"] == 0
    # The arena: what STRATA_GPU_BYTES leaves beside its bounce region. Its peak holds at least
    # what arena_minimum counts at once (the buckets, the gathered group, the shard's copy the
    # gather read, the persistent group's copy); in an arena this roomy, step()'s gather of the
    # next step's first group may also start before the dropped copy is gone (the engine waits
    # for it only when the room is short: test_strata_arena_limit_on_the_host_backend).
    assert ok["arena_capacity_bytes"] == cb.arena_usable(HOST_SETTINGS.gpu_bytes)
    gathered = cb.largest_gathered(HOST_MODEL.with_layers(out["predicted_layers"]), "cpu",
                                   HOST_SETTINGS)
    print(f"strata-cpu arena peak: {ok['arena_peak_bytes']:,} measured, {n.arena_min:,} "
          f"predicted at least (+ {gathered:,} with a second gathered copy)")
    assert n.arena_min - TIER_SLACK <= ok["arena_peak_bytes"] <= n.arena_min + gathered + TIER_SLACK


def test_strata_nvme_limit_on_the_host_backend(tmp_path):
    host_backend()
    (tmp_path / "nvme").mkdir()
    res = BASE.replace(host=8 * GiB, nvme=40 * MiB, nvme_path=str(tmp_path / "nvme"))
    out, results = search_host(tmp_path, "strata-nvme", res)
    ok = assert_between(out, results, "nvme", "NVMe")
    n = cb.need("strata-nvme", HOST_MODEL.with_layers(out["predicted_layers"]), "cpu",
                HOST_SETTINGS)
    stored = sum(b for p, w, b in n.items if p == "nvme" and "while registration" not in w)
    print(f"strata-nvme NVMe: {ok['nvme_peak_bytes']:,} measured, {stored:,} predicted; CPU "
          f"tier {ok['cpu_tier_peak_bytes']:,} of {ok['cpu_tier_bytes']:,}")
    assert within(ok["nvme_peak_bytes"], stored)
    assert ok["cpu_tier_peak_bytes"] <= ok["cpu_tier_bytes"] <= n.pinned


def test_strata_arena_limit_on_the_host_backend(tmp_path):
    host_backend()
    res = BASE.replace(host=8 * GiB, pinned=2 * GiB)
    settings = cb.Settings.of(HOST_SETTINGS, "cpu", gpu_bytes="24MiB")
    results = {}
    out = cs.largest("strata-cpu", HOST_MODEL, "cpu", res, settings,
                     worker_probe(tmp_path, HOST_MODEL, res, settings, results),
                     budget_s=120, say=print)
    assert out["bound"] == "arena", out
    assert [p["status"] for p in out["probes"]] == ["ok", "oom"], out["probes"]
    above = results[out["probes"][1]["layers"]]
    assert "ResourceExhaustedError" in above["error"] and "gpu tier" in above["error"]
