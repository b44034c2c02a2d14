"""compare_time.py (no torch): each system's share of the comparison's time. At the GPU
defaults strata-nvme's disk-bound step must get the time its bytes need instead of an equal
share (which would cut it and fail the run); a system gets its estimate plus the others' slack;
when the estimates do not fit, each gets its proportional part, never more than is left."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                "torch_trainer"))

import compare  # noqa: E402  (imports no torch)
import compare_budget as cb  # noqa: E402
import compare_time as ct  # noqa: E402

# compare.py's GPU defaults: 537 M parameters.
CUDA_MODEL = cb.Model(vocab=32768, seq_len=1024, d_model=2048, heads=16, layers=8)
SYSTEMS = ("fsdp2-nooffload", "fsdp2", "strata-cpu", "strata-nvme", "torch")


def test_strata_nvme_is_estimated_by_its_disk_traffic():
    est = {s: ct.expected_s(s, CUDA_MODEL, "cuda", 6) for s in SYSTEMS}
    # 26 B a parameter on NVMe a step at 1.5 GB/s (and once at registration), plus the CPU
    # Adam's traffic, six steps.
    nvme = cb.need("strata-nvme", CUDA_MODEL, "cuda").nvme
    assert nvme == pytest.approx(26 * CUDA_MODEL.parameters(), rel=0.02)
    adam = CUDA_MODEL.parameters() * 28 / ct.HOST_ADAM_BYTES_PER_S
    assert est["strata-nvme"] == pytest.approx(15 + nvme / 1.5e9 + 6 * (nvme / 1.5e9 + adam))
    assert est["strata-cpu"] == est["fsdp2"] == pytest.approx(15 + 6 * adam)
    assert est["torch"] == est["fsdp2-nooffload"] == 15
    assert 70 < est["strata-nvme"] < 100  # ~10 s a step: an equal share (~30 s) would cut it


def test_a_system_gets_its_estimate_and_the_slack():
    assert ct.limit_s(100, [10, 20, 30]) == pytest.approx(50)  # 10 + the 40 s nobody needs
    assert ct.limit_s(60, [10, 20, 30]) == pytest.approx(10)  # exactly fits: its estimate
    # Too little: proportional (60/120 of each), and the rest is left to the others.
    assert ct.limit_s(60, [40, 40, 40]) == pytest.approx(20)
    assert ct.limit_s(60, [80, 20, 20]) == pytest.approx(40)


def test_the_gpu_comparison_fits_strata_nvme_in_the_time_left():
    # compare.py's share of gpu-check's 285 s, after a smoke stage and the data (~50 s at
    # worst), its default steps, the cheaper systems first, each taking its estimate.
    available = compare.COMPARISON_SHARE * 285 - 50
    steps = compare.DEFAULTS["cuda"]["steps"]
    est = sorted((ct.expected_s(s, CUDA_MODEL, "cuda", steps), s) for s in SYSTEMS)
    assert est[-1][1] == "strata-nvme"
    left, limits = available, []
    for i, (e, system) in enumerate(est):
        limits.append(ct.limit_s(left, [x for x, _ in est[i:]]))
        left -= min(e, limits[-1])
    assert all(limit >= e for limit, (e, _) in zip(limits, est)), (limits, est)


def test_nothing_left_gives_nothing():
    assert ct.limit_s(0, [10, 20]) == 0
    assert ct.limit_s(-5, [10]) == 0
    assert ct.limit_s(30, [0, 0]) == 30


def test_on_the_cpu_the_shares_are_about_equal():
    model = cb.Model(vocab=64, seq_len=64, d_model=64, heads=4, layers=2)
    est = [ct.expected_s(s, model, "cpu", 4) for s in ("strata-cpu", "strata-nvme", "torch")]
    assert max(est) - min(est) < 0.1
