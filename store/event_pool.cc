#include "event_pool.h"

#include "strata/base/mutex.h"

namespace strata {
namespace {

// Free events kept for reuse; more than this many idle at once are destroyed.
constexpr size_t kMaxFree = 256;

}  // namespace

EventPool::EventPool(Device& device) : device_(device), state_(std::make_shared<State>()) {}

absl::StatusOr<std::shared_ptr<Event>> EventPool::get() {
  std::unique_ptr<Event> event;
  {
    MutexLock lock(&state_->mu);
    if (!state_->free.empty()) {
      event = std::move(state_->free.back());
      state_->free.pop_back();
    }
  }
  if (event == nullptr) {
    auto created = device_.create_event();
    if (!created.ok()) return created.status();
    event = *std::move(created);
    MutexLock lock(&state_->mu);
    ++state_->created;
  }
  // The deleter owns the pool state, so an event returned after the pool is gone still has a
  // free list to go to (and is destroyed with it).
  return std::shared_ptr<Event>(event.release(), [state = state_](Event* returned) {
    std::unique_ptr<Event> owned(returned);
    MutexLock lock(&state->mu);
    if (state->free.size() < kMaxFree) state->free.push_back(std::move(owned));
  });
}

absl::StatusOr<std::shared_ptr<Event>> EventPool::record(Stream& stream) {
  auto event = get();
  if (!event.ok()) return event.status();
  if (auto status = device_.record(**event, stream); !status.ok()) return status;
  return event;
}

uint64_t EventPool::created() const {
  MutexLock lock(&state_->mu);
  return state_->created;
}

}  // namespace strata
