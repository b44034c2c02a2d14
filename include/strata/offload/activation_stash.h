// Moved: strata/offload/activation_stash.h is now strata/activations/activation_stash.h.
#pragma once
#pragma message( \
    "strata/offload/activation_stash.h moved to strata/activations/activation_stash.h: include that instead")
#include "strata/activations/activation_stash.h"
