// EventPool: device events reused instead of created per use.
//
// The store records an event at every release and after every move; creating one each time
// would leak events into busy lists on CUDA and cost a driver call per release. An event handed
// out is a shared_ptr whose last owner returns it to the pool (up to a bound; beyond it the event
// is destroyed). An event comes back only when nobody holds it, so nobody can wait on it after it
// is recorded again for something else.
//
// The pool's free list outlives the pool itself while events are out; the Device must outlive
// every event. Thread-safe.
#pragma once

#include <absl/status/statusor.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/device/device.h"

namespace strata {

class EventPool {
 public:
  explicit EventPool(Device& device);
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A pooled event recorded now at the end of `stream`'s work.
  absl::StatusOr<std::shared_ptr<Event>> record(Stream& stream);
  // A pooled event not recorded yet: its owner records it before anyone waits on it.
  absl::StatusOr<std::shared_ptr<Event>> take() { return get(); }
  // Events created so far (not reused): stays small when reuse works.
  uint64_t created() const;

 private:
  struct State {
    absl::Mutex mu;
    std::vector<std::unique_ptr<Event>> free ABSL_GUARDED_BY(mu);
    uint64_t created ABSL_GUARDED_BY(mu) = 0;
  };
  absl::StatusOr<std::shared_ptr<Event>> get();

  Device& device_;
  const std::shared_ptr<State> state_;
};

}  // namespace strata
