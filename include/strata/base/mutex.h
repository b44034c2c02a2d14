// strata::MutexLock — absl::MutexLock that also tells ThreadSanitizer about the lock edge.
//
// Debian's Abseil is not built with TSan, so TSan cannot see absl::Mutex synchronise and reports
// races on every ABSL_GUARDED_BY member. Taking locks through these helpers keeps the TSan build
// meaningful; in every other build they compile to plain absl calls.
#pragma once

#include <absl/synchronization/mutex.h>

#if defined(STRATA_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

namespace strata {

inline void tsan_acquire([[maybe_unused]] const void* addr) {
#if defined(STRATA_TSAN)
  __tsan_acquire(const_cast<void*>(addr));
#endif
}

inline void tsan_release([[maybe_unused]] const void* addr) {
#if defined(STRATA_TSAN)
  __tsan_release(const_cast<void*>(addr));
#endif
}

// Debian's Abseil is built without NDEBUG, so by default every absl::Mutex::Lock also updates a
// process-wide deadlock graph under a global spinlock: a serialisation point on every I/O
// completion, and (being uninstrumented) a source of false TSan reports. strata's lock order is
// checked by its own tests, so the first strata lock turns the detector off, once.
inline void disable_abseil_deadlock_detection() {
  static const bool done = [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    return true;
  }();
  (void)done;
}

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(absl::Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    disable_abseil_deadlock_detection();
    mu_->Lock();
    tsan_acquire(mu_);
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    tsan_release(mu_);
    mu_->Unlock();
  }

 private:
  absl::Mutex* const mu_;
};

// Temporarily releases a held mutex (for I/O and host waits).
class ABSL_SCOPED_LOCKABLE MutexUnlock {
 public:
  explicit MutexUnlock(absl::Mutex* mu) ABSL_UNLOCK_FUNCTION(mu) : mu_(mu) {
    tsan_release(mu_);
    mu_->Unlock();
  }
  ~MutexUnlock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->Lock();
    tsan_acquire(mu_);
  }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  absl::Mutex* const mu_;
};

// cv->Wait(mu) with the TSan edges; `mu` must be held.
inline void wait(absl::CondVar* cv, absl::Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  tsan_release(mu);
  cv->Wait(mu);
  tsan_acquire(mu);
}

// cv->WaitWithTimeout(mu, timeout); returns true on timeout.
inline bool wait_with_timeout(absl::CondVar* cv, absl::Mutex* mu, absl::Duration timeout)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  tsan_release(mu);
  const bool timed_out = cv->WaitWithTimeout(mu, timeout);
  tsan_acquire(mu);
  return timed_out;
}

}  // namespace strata
