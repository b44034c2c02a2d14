// Moved: strata/offload/cpu_pool.h is now strata/optimizer/cpu_pool.h.
#pragma once
#pragma message( \
    "strata/offload/cpu_pool.h moved to strata/optimizer/cpu_pool.h: include that instead")
#include "strata/optimizer/cpu_pool.h"
