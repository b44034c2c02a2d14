#include "bench/optimizer/timed_comm.h"

#include <chrono>
#include <utility>

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The inner work, and the time from the issue to the first wait() or synchronize() that
// returned, added to the communicator's count once.
class TimedWork final : public CollectiveWork {
 public:
  TimedWork(std::unique_ptr<CollectiveWork> inner, Clock::time_point start,
            std::shared_ptr<std::atomic<uint64_t>> ns)
      : inner_(std::move(inner)), start_(start), ns_(std::move(ns)) {}

  absl::Status wait() override { return done(inner_->wait()); }
  absl::Status synchronize() override { return done(inner_->synchronize()); }
  uint64_t sequence() const override { return inner_->sequence(); }

 private:
  absl::Status done(absl::Status status) {
    if (!counted_) {
      counted_ = true;
      ns_->fetch_add(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count()));
    }
    return status;
  }

  std::unique_ptr<CollectiveWork> inner_;
  Clock::time_point start_;
  std::shared_ptr<std::atomic<uint64_t>> ns_;
  bool counted_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CollectiveWork>> AllReduceTimer::all_reduce(
    const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
    const CollectiveOptions& options) {
  const Clock::time_point start = Clock::now();
  auto work = inner_.all_reduce(send, recv, count, type, op, options);
  if (!work.ok()) return work.status();
  return std::unique_ptr<CollectiveWork>(std::make_unique<TimedWork>(*std::move(work), start, ns_));
}

}  // namespace strata::bench
