// Moved: strata/offload/zero_engine.h is now strata/zero/zero_engine.h.
#pragma once
#pragma message( \
    "strata/offload/zero_engine.h moved to strata/zero/zero_engine.h: include that instead")
#include "strata/zero/zero_engine.h"
