// IoWaiter: blocks until every request of a batch has completed, keeping the first error.
#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>

#include <memory>

#include "strata/base/mutex.h"
#include "strata/nvme/io_engine.h"

namespace strata {
namespace {

// A Status whose message is not shared with `s`. absl::Status shares its message through a
// reference count inside the (uninstrumented) Abseil library, so TSan cannot see two threads
// hand one over; the waiter keeps and returns private copies.
absl::Status unshared(const absl::Status& s) { return absl::Status(s.code(), s.message()); }

struct WaiterCore {
  absl::Mutex mu;
  absl::CondVar cv;
  uint64_t pending ABSL_GUARDED_BY(mu) = 0;
  absl::Status first_error ABSL_GUARDED_BY(mu);

  void finish(absl::Status status) {
    MutexLock lock(&mu);
    if (!status.ok() && first_error.ok()) first_error = unshared(status);
    if (--pending == 0) cv.SignalAll();
  }
};

// A tracked callback. If it is destroyed without being called (its batch was rejected by
// submit), it still counts as finished, so wait() cannot hang on a request that never ran.
class Tracked {
 public:
  explicit Tracked(std::shared_ptr<WaiterCore> state) : state_(std::move(state)) {}
  Tracked(Tracked&& other) noexcept = default;
  Tracked& operator=(Tracked&&) = delete;
  Tracked(const Tracked&) = delete;
  ~Tracked() {
    if (state_ != nullptr) {
      state_->finish(absl::CancelledError(
          "an I/O request was dropped without running (submit() rejected its batch)"));
    }
  }
  void operator()(absl::Status status) && {
    std::shared_ptr<WaiterCore> state = std::move(state_);
    state->finish(std::move(status));
  }

 private:
  std::shared_ptr<WaiterCore> state_;
};

}  // namespace

struct IoWaiter::State : WaiterCore {};

IoWaiter::IoWaiter() : state_(std::make_shared<State>()) {}

// Waiting here keeps buffers owned next to the waiter alive until their requests finish.
IoWaiter::~IoWaiter() { (void)wait(); }

IoCallback IoWaiter::track() {
  {
    MutexLock lock(&state_->mu);
    ++state_->pending;
  }
  return Tracked(state_);
}

absl::Status IoWaiter::wait() {
  MutexLock lock(&state_->mu);
  while (state_->pending != 0) strata::wait(&state_->cv, &state_->mu);
  return unshared(state_->first_error);
}

}  // namespace strata
