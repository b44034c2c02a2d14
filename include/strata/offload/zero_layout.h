// Moved: strata/offload/zero_layout.h is now strata/zero/zero_layout.h.
#pragma once
#pragma message( \
    "strata/offload/zero_layout.h moved to strata/zero/zero_layout.h: include that instead")
#include "strata/zero/zero_layout.h"
