#include "host_streams.h"

#include <algorithm>

#include "strata/base/mutex.h"

namespace strata {

bool StreamGate::State::is_open() const {
  MutexLock lock(&mu);
  return open;
}

void StreamGate::State::pass() {
  MutexLock lock(&mu);
  if (open) return;
  ++held;
  changed.SignalAll();
  while (!open) wait(&changed, &mu);
  --held;
}

StreamGate::StreamGate(std::shared_ptr<State> state) : state_(std::move(state)) {}

StreamGate::~StreamGate() { open(); }

void StreamGate::open() {
  MutexLock lock(&state_->mu);
  state_->open = true;
  state_->changed.SignalAll();
}

bool StreamGate::is_open() const { return state_->is_open(); }

uint64_t StreamGate::held() const {
  MutexLock lock(&state_->mu);
  return state_->held;
}

void StreamGate::wait_until_held(uint64_t count) const {
  MutexLock lock(&state_->mu);
  while (!state_->open && state_->held < count) wait(&state_->changed, &state_->mu);
}

namespace detail {

std::vector<std::shared_ptr<StreamGate::State>> HostDeviceState::device_gates_for(
    const StreamQueue* queue) {
  MutexLock lock(&mu);
  std::erase_if(gates, [](const DeviceGate& g) { return g.state->is_open(); });
  std::vector<std::shared_ptr<StreamGate::State>> closed;
  for (const DeviceGate& g : gates) {
    if (std::find(g.exempt.begin(), g.exempt.end(), queue) == g.exempt.end()) {
      closed.push_back(g.state);
    }
  }
  return closed;
}

void HostDeviceState::add_gate(DeviceGate gate) {
  MutexLock lock(&mu);
  gates.push_back(std::move(gate));
}

uint64_t HostDeviceState::add_queue(const std::shared_ptr<StreamQueue>& queue) {
  MutexLock lock(&mu);
  const uint64_t id = next_stream_id++;
  queues.emplace(id, queue);
  return id;
}

void HostDeviceState::remove_queue(uint64_t id) {
  MutexLock lock(&mu);
  queues.erase(id);
}

std::shared_ptr<StreamQueue> HostDeviceState::find_queue(uint64_t id) {
  MutexLock lock(&mu);
  auto it = queues.find(id);
  return it == queues.end() ? nullptr : it->second.lock();
}

StreamQueue::StreamQueue(std::shared_ptr<HostDeviceState> shared)
    : owner(std::move(shared)), worker_([this] { run(); }) {}

StreamQueue::~StreamQueue() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  worker_.join();  // drains the queue first, as cudaStreamDestroy lets queued work finish
  if (id != 0) owner->remove_queue(id);
}

void StreamQueue::enqueue(StreamWork op) {
  std::vector<std::shared_ptr<StreamGate::State>> gates = owner->device_gates_for(this);
  MutexLock lock(&mu_);
  std::erase_if(gates_, [](const auto& g) { return g->is_open(); });
  gates.insert(gates.end(), gates_.begin(), gates_.end());
  if (!gates.empty()) {
    op = [gates = std::move(gates), op = std::move(op)]() mutable {
      for (const auto& gate : gates) gate->pass();
      std::move(op)();
    };
  }
  queue_.push_back(std::move(op));
  ++submitted_;
  work_.Signal();
}

void StreamQueue::add_gate(std::shared_ptr<StreamGate::State> gate) {
  MutexLock lock(&mu_);
  gates_.push_back(std::move(gate));
}

void StreamQueue::drain() {
  MutexLock lock(&mu_);
  const uint64_t target = submitted_;
  while (completed_ < target) wait(&idle_, &mu_);
}

bool StreamQueue::idle() {
  if (!owner->device_gates_for(this).empty()) return false;
  MutexLock lock(&mu_);
  std::erase_if(gates_, [](const auto& g) { return g->is_open(); });
  return gates_.empty() && completed_ == submitted_;
}

void StreamQueue::run() {
  for (;;) {
    StreamWork op;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) wait(&work_, &mu_);
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(op)();
    MutexLock lock(&mu_);
    ++completed_;
    idle_.SignalAll();
  }
}

}  // namespace detail
}  // namespace strata
