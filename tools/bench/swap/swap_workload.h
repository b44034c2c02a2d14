// offload-bench --workload=swap (the default): every asked path's bandwidth through the
// TensorStore against its raw baseline, per --tensor-bytes size, as a table, JSON, CSV and SVG;
// or, with --tune, the I/O settings sweep (bench/swap/tune.h).
#pragma once

#include "bench/common.h"
#include "cli.h"

namespace strata::bench {

// `options` parsed and checked by the flag parser (paths, sizes, repeat, the tune defaults);
// returns the exit code. Output flags that cannot be opened are usage errors through `flags`.
int run_swap_workload(Options options, bool tune, const cli::FlagSet& flags);

}  // namespace strata::bench
