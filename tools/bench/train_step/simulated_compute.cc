#include "bench/train_step/simulated_compute.h"

#include <absl/time/clock.h>

#include <thread>

namespace strata::bench {

void simulate_compute(absl::Duration duration, std::atomic<int64_t>* spent_ns) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + duration;
  constexpr absl::Duration kSpin = absl::Microseconds(200);
  if (duration > kSpin) absl::SleepFor(duration - kSpin);
  while (absl::Now() < deadline) std::this_thread::yield();
  spent_ns->fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start));
}

}  // namespace strata::bench
