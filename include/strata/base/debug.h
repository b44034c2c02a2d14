// Debug assertions for internal invariants (never for user errors, which are absl::Status).
// Active in builds without NDEBUG (Debug, and the sanitizer builds that `make test` runs).
#pragma once

#include <absl/status/status.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#if defined(NDEBUG)
#define STRATA_DEBUG_CHECKS 0
#else
#define STRATA_DEBUG_CHECKS 1
#endif

#define STRATA_DCHECK(condition)                                                                \
  do {                                                                                          \
    if (STRATA_DEBUG_CHECKS && !(condition)) {                                                  \
      std::fprintf(stderr, "%s:%d: strata internal invariant failed: %s\n", __FILE__, __LINE__, \
                   #condition);                                                                 \
      std::abort();                                                                             \
    }                                                                                           \
  } while (false)

// Evaluates `expr` (an absl::Status) only in debug builds and aborts with its message.
#define STRATA_DCHECK_OK(expr)                                                              \
  do {                                                                                      \
    if (STRATA_DEBUG_CHECKS) {                                                              \
      const ::absl::Status strata_dcheck_status = (expr);                                   \
      if (!strata_dcheck_status.ok()) {                                                     \
        std::fprintf(stderr, "%s:%d: strata internal invariant failed: %s: %s\n", __FILE__, \
                     __LINE__, #expr, std::string(strata_dcheck_status.message()).c_str()); \
        std::abort();                                                                       \
      }                                                                                     \
    }                                                                                       \
  } while (false)
