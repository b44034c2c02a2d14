// offload-bench --svg: runtime GB/s against tensor size (log x axis), one line per path, as
// plain SVG text (no plotting dependency).
#pragma once

#include <string>
#include <vector>

#include "bench/common.h"

namespace strata::bench {

// One <polyline class="series" data-path="..."> per path (points in tensor-size order), a marker
// per row, axes with ticks and labels, and a legend. `title` goes above the plot.
std::string to_svg(const std::vector<Row>& rows, const std::string& title);

}  // namespace strata::bench
