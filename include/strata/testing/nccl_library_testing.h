// Test hook for the NCCL loader: the search of strata/comm/nccl_library.h made afresh from the
// current environment, not cached (a library it loads stays loaded).
#pragma once

#include <absl/status/statusor.h>

#include <string>

#include "strata/comm/nccl_library.h"

namespace strata::testing {

// Which of the search's steps run: a test on a machine that has NCCL installed (or loaded
// already) leaves out those steps to see the search fail. A step left out is reported so.
struct NcclSearchSteps {
  bool already_loaded = true;
  bool system = true;
};

NcclSearch search_nccl_uncached(NcclSearchSteps steps = {});

// What comm's table of NCCL functions (comm/nccl_api.h) answered, called through the table.
struct NcclApiProbe {
  int version = 0;         // the table's ncclGetVersion
  std::string no_error;    // the table's ncclGetErrorString(ncclSuccess)
  bool has_split = false;  // the optional ncclCommSplit was found
};

// The table resolved from `search`'s library, as comm resolves it from nccl_library()'s (an error
// names the functions the library lacks); Unimplemented in a build without the NCCL backend.
absl::StatusOr<NcclApiProbe> probe_nccl_api(const NcclSearch& search);

// comm's own table, through load_nccl_api(): resolved once per process from nccl_library().
absl::StatusOr<NcclApiProbe> probe_loaded_nccl_api();

}  // namespace strata::testing
