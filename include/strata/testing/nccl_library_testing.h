// Test hook for the NCCL loader: the search of strata/comm/nccl_library.h made afresh from the
// current environment, not cached (a library it loads stays loaded).
#pragma once

#include "strata/comm/nccl_library.h"

namespace strata::testing {

NcclSearch search_nccl_uncached();

}  // namespace strata::testing
