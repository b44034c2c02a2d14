// The simulated compute of the training-step workloads on the host backend and on CUDA: a timed
// wait on the stream that runs it, which keeps the stream busy for that time without burning a
// core (the CPU optimizer step running beside it needs them).
#pragma once

#include <absl/time/time.h>

#include <atomic>
#include <cstdint>

namespace strata::bench {

// Waits `duration` and adds the time it took to `spent_ns`. Sleeps to just short of the
// deadline and yields for the rest, because a plain sleep overshoots by tens of microseconds
// per layer, which over 2L layers would inflate every step against the bound by a fixed few
// percent.
void simulate_compute(absl::Duration duration, std::atomic<int64_t>* spent_ns);

}  // namespace strata::bench
