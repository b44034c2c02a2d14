#!/usr/bin/env python3
"""CTest examples.torch_gpt_compare_cpu: examples/torch_trainer/compare.py in its CPU mode (tiny
GPT, strata-cpu, strata-nvme in a directory, FSDP2, plain torch; a small search), checked from
the outside: exit 0 and PASS; the JSON's fields; every trained system's losses within the stated
tolerance of the reference's, step by step; strata-cpu's search bounded by its small CPU tier
(a try that did not fit: ResourceExhaustedError), the others' by --search-max-layers; the SVG is
well-formed XML with one line (the search) and one square (the comparison) per trained system;
FSDP2's skip line names the torch it needs.

    check_compare.py COMPARE_PY WORK_DIR
"""

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET


def fail(message: str) -> None:
    print(f"check_compare: {message}", flush=True)
    sys.exit(1)


def main() -> int:
    compare, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "nvme"))
    out_json, out_svg = os.path.join(work, "compare.json"), os.path.join(work, "compare.svg")
    cmd = [sys.executable, compare, "--device=cpu", f"--nvme-path={work}/nvme", "--steps=4",
           "--warmup=1", "--search-max-layers=4", "--strata-cpu-bytes=5MiB", "--deadline-s=100",
           f"--json={out_json}", f"--svg={out_svg}"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=150)
    print(proc.stdout, flush=True)
    if proc.returncode == 77:
        return 77
    if proc.returncode != 0 or not proc.stdout.rstrip().endswith("PASS"):
        fail(f"compare.py exited {proc.returncode} (want 0 and PASS)")

    import torch  # compare.py ran, so torch imports
    major_minor = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    want_skip = (r"skipped: fsdp2: FSDP2 \(fully_shard with CPUOffloadPolicy, and fused CPU AdamW\)"
                 r" needs torch >= 2\.4; this torch is " if major_minor < (2, 4) else
                 r"skipped: fsdp2: FSDP2 with CPUOffloadPolicy trains on a CUDA device")
    if not re.search(want_skip, proc.stdout):
        fail(f"no line matching {want_skip!r}")

    with open(out_json) as f:
        r = json.load(f)
    for key in ("device", "torch", "model", "batch", "steps", "tolerance", "tolerance_reason",
                "deadline_s", "elapsed_s", "systems", "search", "skipped", "agreement", "plot",
                "passed"):
        if key not in r:
            fail(f"the JSON has no '{key}'")
    if r["device"] != "cpu" or r["tolerance"] != 1e-5 or not r["passed"]:
        fail(f"device {r['device']}, tolerance {r['tolerance']}, passed {r['passed']}")
    if r["elapsed_s"] > r["deadline_s"]:
        fail(f"elapsed {r['elapsed_s']} s past the deadline {r['deadline_s']} s")
    systems = r["systems"]
    trained = ("strata-cpu", "strata-nvme", "torch")
    for name in trained:
        s = systems.get(name, {})
        if s.get("status") != "ok":
            fail(f"{name} did not train: {s}")
        for key in ("tokens_per_s", "step_s", "forward_s", "backward_s", "optimizer_s",
                    "rss_peak_bytes", "rss_bytes", "pinned_bytes", "parameters", "losses"):
            if s.get(key) is None:
                fail(f"{name} has no '{key}'")
        if len(s["losses"]) != 4 or len(s["steps"]) != 4:
            fail(f"{name}: {len(s['losses'])} losses, want 4")
        if not s["tokens_per_s"] > 0:
            fail(f"{name}: tokens/s {s['tokens_per_s']}")
    for name in ("strata-cpu", "strata-nvme"):
        s = systems[name]
        for key in ("arena_peak_bytes", "arena_capacity_bytes", "cpu_tier_bytes",
                    "exposed_transfer_s", "model_states_bytes"):
            if s.get(key) is None:
                fail(f"{name} has no '{key}'")
    if systems["strata-nvme"]["nvme_peak_bytes"] <= 0:
        fail("strata-nvme used no NVMe")
    if systems["fsdp2"].get("status") != "skipped":
        fail(f"fsdp2 on the CPU: {systems['fsdp2']}")
    # Loss agreement, recomputed here: every step of every trained system.
    ref = systems["torch"]["losses"]
    for name in trained:
        for step, (a, b) in enumerate(zip(systems[name]["losses"], ref), 1):
            if abs(a - b) > r["tolerance"] * abs(b):
                fail(f"{name} step {step}: {a} against torch's {b}")
    if r["agreement"]["reference"] != "torch" or r["agreement"]["disagreements"]:
        fail(f"agreement: {r['agreement']}")
    # The search: strata-cpu's 5 MiB CPU tier stops it (a try that does not fit); torch and
    # strata-nvme reach --search-max-layers.
    s = r["search"]["strata-cpu"]
    if s["bound"] != "oom" or not any(t["status"] == "oom" for t in s["tries"]):
        fail(f"strata-cpu's search: {s}")
    if not any("ResourceExhaustedError" in (t.get("why") or "") for t in s["tries"]):
        fail(f"strata-cpu's search names no ResourceExhaustedError: {s['tries']}")
    if r["search"]["torch"]["bound"] != "max" or r["search"]["torch"]["largest_layers"] != 4:
        fail(f"torch's search: {r['search']['torch']}")
    # The SVG: well-formed, a polyline per system with points, the title.
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.parse(out_svg).getroot()
    if root.tag != ns + "svg":
        fail(f"the SVG's root is {root.tag}")
    series = {p.get("data-system"): p.get("points") for p in root.iter(ns + "polyline")}
    squares = {p.get("data-system") for p in root.iter(ns + "rect") if p.get("data-system")}
    if set(series) != set(trained) or squares != set(trained):
        fail(f"the SVG's series: {sorted(series)}, comparison squares: {sorted(squares)}")
    for name in trained:
        plot = r["plot"][name]
        if not plot["search"] or len(series[name].split()) != len(plot["search"]):
            fail(f"the SVG's {name} points: {series[name]} against {plot}")
        if plot["comparison"]["parameters"] != systems[name]["parameters"]:
            fail(f"the plot's {name} comparison point: {plot['comparison']}")
    if "tokens/s" not in "".join(t.text or "" for t in root.iter(ns + "text")):
        fail("the SVG names no axis 'tokens/s'")
    print("check_compare: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
