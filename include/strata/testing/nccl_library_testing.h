// Test hook for the NCCL loader: the search of strata/comm/nccl_library.h made afresh from the
// current environment, not cached (a library it loads stays loaded).
#pragma once

#include "strata/comm/nccl_library.h"

namespace strata::testing {

// Which of the search's steps run: a test on a machine that has NCCL installed (or loaded
// already) leaves out those steps to see the search fail. A step left out is reported so.
struct NcclSearchSteps {
  bool already_loaded = true;
  bool system = true;
};

NcclSearch search_nccl_uncached(NcclSearchSteps steps = {});

}  // namespace strata::testing
