// FaultInjector: makes chosen I/O requests fail, come back short, or wait, so tests can prove
// what happens on EIO, ENOSPC, short transfers, EAGAIN and slow drives.
//
// Engines consult it on every raw completion — after the real transfer, before their retry
// logic — so a rule that turns a result into "-EAGAIN" or "half the bytes" exercises the engine's
// own resubmission paths, not a simulation of them.
#pragma once

#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "strata/nvme/io_engine.h"

namespace strata {

struct FaultRule {
  enum class Action {
    kError,          // the request completes with -error_number (not retried unless EAGAIN/EINTR)
    kShortTransfer,  // the result reports only `short_bytes` transferred (engine resubmits rest)
    kDelay,          // the completion is held back for `delay`
  };
  std::optional<IoOp> op;        // nullopt: reads and writes
  std::optional<uint32_t> file;  // nullopt: every file
  uint64_t skip = 0;             // let this many matching attempts through first
  uint64_t times = 1;            // then apply to this many (UINT64_MAX: forever)
  Action action = Action::kError;
  int error_number = 5;  // EIO
  uint64_t short_bytes = 0;
  absl::Duration delay = absl::ZeroDuration();
};

class FaultInjector {
 public:
  void add(FaultRule rule);
  void clear();  // releases held registrations too
  // Faults applied so far.
  uint64_t fired() const;

  struct Decision {
    int64_t result;                               // what the engine should see
    absl::Duration delay = absl::ZeroDuration();  // wait this long before handling it
  };
  // Called by engines for each attempt: `result` is the real syscall/CQE result (bytes or -errno).
  Decision apply(IoOp op, uint32_t file, int64_t result);

  // Buffer registrations (one per buffer and ring, io_uring only) after the first `skip` fail
  // with -error_number instead of reaching the kernel: ENOMEM is what RLIMIT_MEMLOCK gives.
  void fail_registrations(uint64_t skip, int error_number);
  // While held, each registration waits in apply_registration() until released (the sparse
  // table a ring starts with too: hold after the engine exists). Tests use it to keep
  // registration work queued.
  void hold_registrations();
  void release_registrations();
  // Called by the engine before each registration: 0 to go ahead, or -errno to report instead.
  int apply_registration();

 private:
  struct Armed {
    FaultRule rule;
    uint64_t seen = 0;
    uint64_t applied = 0;
  };
  mutable absl::Mutex mu_;
  std::vector<Armed> rules_ ABSL_GUARDED_BY(mu_);
  uint64_t fired_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<uint64_t> registrations_left_ ABSL_GUARDED_BY(mu_);  // nullopt: no fault armed
  int registration_error_ ABSL_GUARDED_BY(mu_) = 0;
  bool registrations_held_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar released_;
};

}  // namespace strata
