"""compare.py's outputs that need no torch: the log's table and the SVG plot of tokens/s against
model size (hand-written SVG in the style of tools/bench/swap/plot.cc: white background, axes, grey
grid lines, Okabe-Ito colours, a legend on the right; no plotting library)."""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

# Colour-blind-safe (Okabe-Ito), as tools/bench/swap/plot.cc.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.1f}"


def count(n) -> str:
    """12.3M, 1.50B, 110k."""
    if n is None:
        return "-"
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


COLUMNS = (
    ("system", 15), ("status", 8), ("params", 7), ("tokens/s", 9), ("step ms", 8),
    ("fwd+bwd ms", 10), ("opt ms", 7), ("exposed ms", 10), ("wait ms", 7), ("GPU peak", 8),
    ("GPU held", 8), ("RSS MiB", 8), ("pinned MiB", 10), ("largest", 14),
)

# What each column is (the log and the summary print it under the table).
LEGEND = ("medians of the timed steps; fwd+bwd: forward and backward on torch's stream; "
          "exposed: fwd+bwd less fsdp2-nooffload's (the compute-only reference: what waiting "
          "for transfers adds); wait: strata's host waits for parameter gathers; GPU peak MiB: "
          "torch's max allocated + strata's arena peak; GPU held MiB: what the process held on "
          "the GPU (torch's max reserved + strata's reserved arena + the rest mem_get_info "
          "saw: NCCL, kernels); pinned: host bytes page-locked; largest: the largest model "
          "that trained in the search's probes / predicted (! when a probe contradicted the "
          "prediction)")


def largest_cell(found: dict | None) -> str:
    """"7.6B/7.6B": the largest probe that trained / the prediction; "-/7.6B" when no probe
    trained; "!" marks a prediction a probe contradicted."""
    if not found or found.get("predicted_parameters") is None:
        return "-"
    cell = f"{count(found.get('confirmed_parameters'))}/{count(found['predicted_parameters'])}"
    return cell + ("!" if found.get("prediction_wrong") else "")


def table(systems: dict, search: dict) -> str:
    """One row per system: the comparison's medians over the timed steps and the search's
    largest model (compare_search.largest's results)."""
    lines = ["  ".join(f"{name:>{w}}" for name, w in COLUMNS)]
    for name, r in systems.items():
        largest = largest_cell(search.get(name))
        if r.get("status") != "ok":
            cells = [name, r.get("status", "?")] + ["-"] * (len(COLUMNS) - 3) + [largest]
        else:
            fwd_bwd = (r["forward_s"] + r["backward_s"]
                       if r.get("forward_s") is not None and r.get("backward_s") is not None
                       else None)
            cells = [name, "ok", count(r["parameters"]), f"{r['tokens_per_s']:.0f}",
                     ms(r["step_s"]), ms(fwd_bwd), ms(r.get("optimizer_s")),
                     ms(r.get("exposed_s")), ms(r.get("exposed_transfer_s")),
                     mib(r.get("gpu_peak_bytes")), mib(r.get("gpu_total_bytes")),
                     mib(r.get("rss_peak_bytes")), mib(r.get("pinned_bytes")), largest]
        lines.append("  ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, COLUMNS)))
    return "\n".join(lines)


STARTUP_PARTS = (("python_s", "python"), ("import_torch_s", "torch"),
                 ("import_strata_s", "strata"), ("data_s", "data"), ("build_s", "build"),
                 ("first_step_s", "step 1"))


def startup(systems: dict) -> str:
    """Each trained system's time from its process's start to the end of its first step, in
    parts (compare_worker.py's "startup"): what a system's share of the deadline went to."""
    cells = []
    for name, r in systems.items():
        st = r.get("startup") or {}
        if r.get("status") != "ok" or st.get("to_first_step_s") is None:
            continue
        total = st["to_first_step_s"] + (st.get("python_s") or 0)
        parts = ", ".join(f"{label} {st[key]:.2f}" for key, label in STARTUP_PARTS
                          if st.get(key) is not None)
        cells.append(f"{name} {total:.1f} s ({parts})")
    return "start-up to the first step's end: " + "; ".join(cells) if cells else ""


def _tick_step(top: float) -> float:
    raw = top / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0):
        if m * magnitude >= raw:
            return m * magnitude
    return 10 * magnitude


def svg(series: dict, title: str, marks: dict | None = None, subtitle: str = "") -> str:
    """series: {system: [(parameters, tokens/s), ...]}, drawn as lines with dots (the search's
    tries); marks: {system: (parameters, tokens/s)}, drawn as squares (the comparison's run, at
    another batch). x: parameters (log scale), y: tokens/s."""
    marks = marks or {}
    width, height = 760.0, 460.0
    left, right, top_m, bottom = 80.0, 170.0, 56.0, 60.0
    plot_w, plot_h = width - left - right, height - top_m - bottom
    points = [p for pts in series.values() for p in pts] + list(marks.values())
    lo = min((p[0] for p in points), default=1)
    hi = max((p[0] for p in points), default=1)
    top = max((p[1] for p in points), default=0)
    log_lo = math.log10(lo) - (0.25 if lo == hi else 0)
    log_hi = math.log10(hi) + (0.25 if lo == hi else 0)
    step = _tick_step(top * 1.1 if top > 0 else 1)
    y_top = math.ceil((top * 1.05 if top > 0 else 1) / step) * step

    def x_of(n):
        return left + (math.log10(n) - log_lo) / (log_hi - log_lo) * plot_w

    def y_of(v):
        return top_m + plot_h - v / y_top * plot_h

    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left:.0f}" y="22" font-size="14">{escape(title)}</text>',
        f'<text x="{left:.0f}" y="40">{escape(subtitle)}</text>',
        f'<g stroke="black"><line x1="{left:.1f}" y1="{top_m:.1f}" x2="{left:.1f}" '
        f'y2="{top_m + plot_h:.1f}"/><line x1="{left:.1f}" y1="{top_m + plot_h:.1f}" '
        f'x2="{left + plot_w:.1f}" y2="{top_m + plot_h:.1f}"/></g>',
    ]
    v = 0.0
    while v <= y_top + step / 2:
        out.append(f'<line x1="{left:.1f}" y1="{y_of(v):.1f}" x2="{left + plot_w:.1f}" '
                   f'y2="{y_of(v):.1f}" stroke="#ddd"/><text x="{left - 6:.1f}" '
                   f'y="{y_of(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    # x ticks at 1, 2 and 5 x 10^e in range; at powers of ten alone when those are too many.
    ticks = [m * 10 ** e for e in range(math.floor(log_lo), math.ceil(log_hi) + 1)
             for m in (1, 2, 5) if log_lo <= math.log10(m * 10 ** e) <= log_hi]
    if len(ticks) > 9:
        ticks = [10 ** e for e in range(math.ceil(log_lo), math.floor(log_hi) + 1)]
    for n in ticks:
        x = x_of(n)
        out.append(f'<line x1="{x:.1f}" y1="{top_m + plot_h:.1f}" x2="{x:.1f}" '
                   f'y2="{top_m + plot_h + 5:.1f}" stroke="black"/><text x="{x:.1f}" '
                   f'y="{top_m + plot_h + 18:.1f}" text-anchor="middle">{count(n)}</text>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 15:.1f}" text-anchor="middle">'
               'model parameters (log scale)</text>')
    out.append(f'<text transform="translate(18 {top_m + plot_h / 2:.1f}) rotate(-90)" '
               'text-anchor="middle">tokens/s</text>')
    legend_y = top_m + 10
    for index, name in enumerate(dict.fromkeys([*series, *marks])):
        colour = COLOURS[index % len(COLOURS)]
        pts = sorted(series.get(name, []))
        if name in marks:
            n, t = marks[name]
            out.append(f'<rect class="comparison" data-system="{escape(name)}" '
                       f'x="{x_of(n) - 4:.1f}" y="{y_of(t) - 4:.1f}" width="8" height="8" '
                       f'fill="{colour}"/>')
        if pts:
            coords = " ".join(f"{x_of(n):.1f},{y_of(t):.1f}" for n, t in pts)
            out.append(f'<polyline class="series" data-system="{escape(name)}" fill="none" '
                       f'stroke="{colour}" stroke-width="2" points="{coords}"/>')
            for n, t in pts:
                out.append(f'<circle cx="{x_of(n):.1f}" cy="{y_of(t):.1f}" r="3" '
                           f'fill="{colour}"/>')
        lx = left + plot_w + 20
        label = name if pts or name in marks else f"{name} (no points)"
        out.append(f'<line x1="{lx:.1f}" y1="{legend_y:.1f}" x2="{lx + 24:.1f}" '
                   f'y2="{legend_y:.1f}" stroke="{colour}" stroke-width="2"/><text '
                   f'x="{lx + 30:.1f}" y="{legend_y + 4:.1f}">{escape(label)}</text>')
        legend_y += 20
    out.append("</svg>")
    return "\n".join(out) + "\n"
