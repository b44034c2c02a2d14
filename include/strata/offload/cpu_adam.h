// Moved: strata/offload/cpu_adam.h is now strata/optimizer/cpu_adam.h.
#pragma once
#pragma message( \
    "strata/offload/cpu_adam.h moved to strata/optimizer/cpu_adam.h: include that instead")
#include "strata/optimizer/cpu_adam.h"
