#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "strata/base/mutex.h"

// Tests take Abseil locks of their own (absl::Notification) before any strata lock: switch the
// deadlock graph off before main, as the first strata lock would.
static const bool kAbseilDeadlockGraphOff = (strata::disable_abseil_deadlock_detection(), true);
