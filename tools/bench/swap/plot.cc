#include "bench/swap/plot.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "strata/base/size.h"

namespace strata::bench {
namespace {

constexpr double kWidth = 760, kHeight = 460;
constexpr double kLeft = 70, kRight = 170, kTop = 40, kBottom = 60;  // margins
// Colour-blind-safe (Okabe-Ito), one per path in kAllPaths order.
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73",
                                    "#CC79A7", "#E69F00", "#56B4E9"};

std::string escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A round step for about five ticks up to `top`.
double tick_step(double top) {
  const double raw = top / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}

}  // namespace

std::string to_svg(const std::vector<Row>& rows, const std::string& title) {
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  uint64_t lo = UINT64_MAX, hi = 0;
  double top = 0;
  for (const Row& r : rows) {
    lo = std::min(lo, r.tensor_bytes);
    hi = std::max(hi, r.tensor_bytes);
    top = std::max(top, r.runtime.max);
  }
  if (rows.empty()) lo = hi = 1;
  // A single size still gets a visible span: half an octave either side.
  const double log_lo = std::log2(static_cast<double>(lo)) - (lo == hi ? 0.5 : 0);
  const double log_hi = std::log2(static_cast<double>(hi)) + (lo == hi ? 0.5 : 0);
  const double step = tick_step(top > 0 ? top * 1.1 : 1);
  const double y_top = std::ceil((top > 0 ? top * 1.05 : 1) / step) * step;
  const auto x_of = [&](uint64_t bytes) {
    return kLeft + (std::log2(static_cast<double>(bytes)) - log_lo) / (log_hi - log_lo) * plot_w;
  };
  const auto y_of = [&](double gbps) { return kTop + plot_h - gbps / y_top * plot_h; };

  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"14\">%s</text>\n",
      kWidth, kHeight, kWidth, kHeight, kLeft, escape(title));
  // Axes, then ticks: y every `step` GB/s, x at each power of two in range.
  svg += absl::StrFormat(
      "<g stroke=\"black\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/></g>\n",
      kLeft, kTop, kLeft, kTop + plot_h, kLeft, kTop + plot_h, kLeft + plot_w, kTop + plot_h);
  for (double v = 0; v <= y_top + step / 2; v += step) {
    svg += absl::StrFormat(
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
        kLeft, y_of(v), kLeft + plot_w, y_of(v), kLeft - 6, y_of(v) + 4, v);
  }
  for (int e = static_cast<int>(std::ceil(log_lo)); e <= static_cast<int>(std::floor(log_hi));
       ++e) {
    const uint64_t bytes = uint64_t{1} << e;
    svg += absl::StrFormat(
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
        x_of(bytes), kTop + plot_h, x_of(bytes), kTop + plot_h + 5, x_of(bytes), kTop + plot_h + 18,
        escape(format_bytes(bytes)));
  }
  svg += absl::StrFormat(
      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">tensor size (log scale)</text>\n"
      "<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">runtime GB/s "
      "(median)</text>\n",
      kLeft + plot_w / 2, kHeight - 15, kTop + plot_h / 2);

  // Series in kAllPaths order, points by tensor size.
  std::map<size_t, std::vector<const Row*>> series;
  for (const Row& r : rows) {
    const size_t index =
        std::find(std::begin(kAllPaths), std::end(kAllPaths), r.path) - std::begin(kAllPaths);
    series[index].push_back(&r);
  }
  double legend_y = kTop + 10;
  for (auto& [index, points] : series) {
    std::sort(points.begin(), points.end(),
              [](const Row* a, const Row* b) { return a->tensor_bytes < b->tensor_bytes; });
    const char* colour = kColours[index % std::size(kColours)];
    const std::string path = escape(points.front()->path);
    std::string coords;
    for (const Row* r : points) {
      coords += absl::StrFormat("%s%.1f,%.1f", coords.empty() ? "" : " ", x_of(r->tensor_bytes),
                                y_of(r->runtime.median));
    }
    svg += absl::StrFormat(
        "<polyline class=\"series\" data-path=\"%s\" fill=\"none\" stroke=\"%s\" "
        "stroke-width=\"2\" points=\"%s\"/>\n",
        path, colour, coords);
    for (const Row* r : points) {
      svg += absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                             x_of(r->tensor_bytes), y_of(r->runtime.median), colour);
    }
    const double lx = kLeft + plot_w + 20;
    svg += absl::StrFormat(
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>"
        "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
        lx, legend_y, lx + 24, legend_y, colour, lx + 30, legend_y + 4, path);
    legend_y += 20;
  }
  return svg + "</svg>\n";
}

}  // namespace strata::bench
