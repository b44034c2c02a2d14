// Moved: strata/offload/offload_optimizer.h is now strata/optimizer/offload_optimizer.h.
#pragma once
#pragma message( \
    "strata/offload/offload_optimizer.h moved to strata/optimizer/offload_optimizer.h: include that instead")
#include "strata/optimizer/offload_optimizer.h"
