"""compare_agreement.py (no torch): the reference, the bounds and the verdict on recorded losses,
as compare.py meets them on a GPU (bf16: FSDP2 the reference, torch informative) and on the CPU
(fp32: torch the reference, everyone bound)."""

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                "torch_trainer"))

import compare_agreement as ca  # noqa: E402

BASE = [10.0, 8.0, 6.0, 5.0]


def scaled(factor_by_step):
    return [b * f for b, f in zip(BASE, factor_by_step)]


def row(result, system):
    return next(r for r in result["rows"] if r["system"] == system)


def test_gpu_fsdp2_is_the_reference_and_strata_is_bound():
    losses = {"fsdp2": BASE, "fsdp2-nooffload": scaled([1, 1.001, 1.002, 1.001]),
              "strata-cpu": scaled([1, 1.01, 1.02, 1.01]), "torch": scaled([1, 1.03, 1, 1])}
    r = ca.agree(losses, "cuda", tolerance=3e-2, torch_tolerance=5e-2)
    assert r["reference"] == "fsdp2"
    assert r["ok"]
    assert math.isclose(row(r, "strata-cpu")["worst"], 0.02)
    assert row(r, "strata-cpu")["binding"] and row(r, "strata-cpu")["step"] == 3
    assert not row(r, "torch")["binding"]
    assert math.isclose(r["fsdp2_spread"], 0.002)  # the measured noise of bf16 training


def test_gpu_strata_beyond_the_bound_fails_on_both_sides_of_it():
    at_bound = {"fsdp2": BASE, "strata-nvme": [10.0, 8.25, 6.0, 5.0]}  # 0.25 / 8 = 2^-5
    assert ca.agree(at_bound, "cuda", 2 ** -5, 5e-2)["ok"]  # == bound passes
    beyond = {"fsdp2": BASE, "strata-nvme": scaled([1, 1, 1, 1.0301])}
    r = ca.agree(beyond, "cuda", 3e-2, 5e-2)
    assert not r["ok"]
    assert [f["system"] for f in r["failures"]] == ["strata-nvme"]
    assert "step 4" in r["failures"][0]["why"]
    below = {"fsdp2": BASE, "strata-nvme": scaled([1, 1, 1, 0.969])}
    assert not ca.agree(below, "cuda", 3e-2, 5e-2)["ok"]  # a difference either way


def test_gpu_torch_outside_its_bound_is_reported_not_failed():
    losses = {"fsdp2": BASE, "strata-cpu": BASE, "torch": scaled([1, 1.2, 1, 1])}
    r = ca.agree(losses, "cuda", 3e-2, 5e-2)
    assert r["ok"]
    t = row(r, "torch")
    assert not t["ok"] and not t["binding"] and "informative" in t["why"]


def test_gpu_without_fsdp2_strata_is_held_to_the_next_reference():
    losses = {"fsdp2-nooffload": BASE, "strata-cpu": scaled([1, 1, 1, 1.5])}
    r = ca.agree(losses, "cuda", 3e-2, 5e-2)
    assert r["reference"] == "fsdp2-nooffload" and not r["ok"]
    assert r["fsdp2_spread"] is None


def test_cpu_torch_is_the_reference_and_everyone_is_bound():
    losses = {"torch": BASE, "strata-cpu": scaled([1, 1 + 5e-6, 1, 1]),
              "strata-nvme": scaled([1, 1, 1 + 2e-5, 1])}
    r = ca.agree(losses, "cpu", 1e-5, 1e-5)
    assert r["reference"] == "torch"
    assert [f["system"] for f in r["failures"]] == ["strata-nvme"]


def test_a_non_finite_loss_fails_its_system_and_is_never_the_reference():
    losses = {"fsdp2": [10.0, None, 6.0, 5.0], "fsdp2-nooffload": BASE, "strata-cpu": BASE}
    r = ca.agree(losses, "cuda", 3e-2, 5e-2)
    assert r["reference"] == "fsdp2-nooffload"
    assert not r["ok"]
    assert r["failures"][0]["system"] == "fsdp2" and "step 2" in r["failures"][0]["why"]
    r = ca.agree({"torch": BASE, "strata-cpu": [10.0, 8.0, math.nan, 5.0]}, "cpu", 1e-5, 1e-5)
    assert not r["ok"] and r["failures"][0]["system"] == "strata-cpu"


def test_fewer_steps_than_the_reference_fails():
    r = ca.agree({"torch": BASE, "strata-cpu": BASE[:3]}, "cpu", 1e-5, 1e-5)
    assert not r["ok"] and row(r, "strata-cpu")["step"] == 4
