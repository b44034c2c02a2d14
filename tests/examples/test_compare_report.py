"""compare_report (examples/torch_trainer): compare.py's table and hand-written SVG, no torch.
CTest examples.torch_gpt_compare_report."""

import os
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                "torch_trainer"))

import compare_report as report  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"


def parse(text):
    return ET.fromstring(text.encode())


def test_svg_lines_squares_and_legend():
    root = parse(report.svg({"strata-cpu": [(2e8, 900.0), (1e8, 1000.0)], "fsdp2": []},
                            "title", {"strata-cpu": (5e7, 4000.0), "torch": (5e7, 5000.0)},
                            "subtitle"))
    lines = {p.get("data-system"): p.get("points") for p in root.iter(NS + "polyline")}
    assert set(lines) == {"strata-cpu"}
    xs = [float(p.split(",")[0]) for p in lines["strata-cpu"].split()]
    assert xs == sorted(xs)  # drawn by size
    squares = {r.get("data-system") for r in root.iter(NS + "rect") if r.get("data-system")}
    assert squares == {"strata-cpu", "torch"}
    texts = [t.text for t in root.iter(NS + "text")]
    assert "fsdp2 (no points)" in texts and "torch" in texts and "subtitle" in texts
    assert "tokens/s" in texts and "model parameters (log scale)" in texts
    assert "50M" in texts and "100M" in texts and "200M" in texts  # 1-2-5 ticks


def test_svg_every_point_inside_the_plot():
    root = parse(report.svg({"a": [(1e5, 1.0), (3e10, 2e6)]}, "t", {"b": (7e6, 5e5)}))
    width, height = float(root.get("width")), float(root.get("height"))
    for c in root.iter(NS + "circle"):
        assert 0 <= float(c.get("cx")) <= width and 0 <= float(c.get("cy")) <= height
    for r in root.iter(NS + "rect"):
        if r.get("data-system"):
            assert 0 <= float(r.get("x")) <= width and 0 <= float(r.get("y")) <= height


def test_svg_empty_single_point_and_escaping():
    parse(report.svg({}, "nothing trained"))  # no points at all: still an SVG
    root = parse(report.svg({"<a&b>": [(112384, 8000.0)]}, 't "<&>"', {}, "s & t"))
    assert any(t.text == 't "<&>"' for t in root.iter(NS + "text"))
    assert [p.get("data-system") for p in root.iter(NS + "polyline")] == ["<a&b>"]


def test_table_rows_by_status():
    ok = {"status": "ok", "parameters": 124_439_808, "tokens_per_s": 12345.6, "step_s": 0.5,
          "forward_s": 0.1, "backward_s": 0.2, "optimizer_s": 0.2, "exposed_s": 0.05,
          "exposed_transfer_s": 0.01, "gpu_peak_bytes": 3 << 30, "gpu_total_bytes": 7 << 30,
          "rss_peak_bytes": 5 << 30, "pinned_bytes": 4 << 30}
    text = report.table({"strata-cpu": ok, "fsdp2": {"status": "skipped"},
                         "torch": {"status": "oom"}, "strata-nvme": {"status": "refused"}},
                        {"strata-cpu": {"predicted_parameters": 2_000_000_000,
                                        "confirmed_parameters": 2_000_000_000},
                         "torch": {"predicted_parameters": 50_000_000,
                                   "confirmed_parameters": None, "prediction_wrong": True}})
    rows = text.splitlines()
    assert rows[0].split()[:4] == ["system", "status", "params", "tokens/s"]
    assert rows[1].split() == ["strata-cpu", "ok", "124M", "12346", "500.0", "300.0", "200.0",
                               "50.0", "10.0", "3072", "7168", "5120", "4096", "2B/2B"]
    assert rows[2].split()[:2] == ["fsdp2", "skipped"] and rows[2].split()[-1] == "-"
    assert rows[3].split()[-1] == "-/50M!"  # no probe trained: the prediction was wrong
    assert rows[4].split()[:2] == ["strata-nvme", "refused"]
    assert "exposed: fwd+bwd less fsdp2-nooffload's" in report.LEGEND


def test_startup_line_sums_each_trained_systems_parts():
    systems = {
        "strata-cpu": {"status": "ok", "startup": {
            "python_s": 0.5, "import_torch_s": 2.0, "import_strata_s": 0.25, "data_s": 0.1,
            "build_s": 3.0, "first_step_s": 4.0, "to_first_step_s": 9.5}},
        "torch": {"status": "ok", "startup": {
            "python_s": 0.5, "import_torch_s": 2.0, "data_s": 0.1, "build_s": 1.0,
            "first_step_s": 1.0, "to_first_step_s": 4.2}},
        "fsdp2": {"status": "skipped"},
        "strata-nvme": {"status": "oom", "startup": {"python_s": 0.5}},
    }
    line = report.startup(systems)
    assert line == ("start-up to the first step's end: strata-cpu 10.0 s (python 0.50, torch "
                    "2.00, strata 0.25, data 0.10, build 3.00, step 1 4.00); torch 4.7 s "
                    "(python 0.50, torch 2.00, data 0.10, build 1.00, step 1 1.00)")
    assert report.startup({"fsdp2": {"status": "skipped"}}) == ""
