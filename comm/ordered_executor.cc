#include "ordered_executor.h"

#include "strata/base/mutex.h"

namespace strata::comm_internal {

OrderedExecutor::OrderedExecutor() : worker_([this] { work(); }) {}

OrderedExecutor::~OrderedExecutor() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
    changed_.SignalAll();
  }
  worker_.join();
}

std::shared_ptr<OrderedExecutor::Ticket> OrderedExecutor::submit(Task task) {
  auto ticket = std::make_shared<Ticket>();
  MutexLock lock(&mutex_);
  queue_.push_back({std::move(task), ticket, absl::Now()});
  changed_.SignalAll();
  return ticket;
}

void OrderedExecutor::run_front() {
  Entry entry = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  tsan_release(&mutex_);
  mutex_.Unlock();
  absl::Status status = entry.task();
  mutex_.Lock();
  tsan_acquire(&mutex_);
  running_ = false;
  entry.ticket->done = true;
  entry.ticket->status = std::move(status);
  changed_.SignalAll();
}

absl::Status OrderedExecutor::wait(const std::shared_ptr<Ticket>& ticket, absl::Duration backstop) {
  const absl::Time deadline = absl::Now() + backstop;
  MutexLock lock(&mutex_);
  while (!ticket->done) {
    if (!running_ && !queue_.empty()) {
      run_front();  // ours or one before it: in order either way
      continue;
    }
    if (wait_with_timeout(&changed_, &mutex_, deadline - absl::Now()) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError("timed out");
    }
  }
  return ticket->status;
}

void OrderedExecutor::drain() {
  MutexLock lock(&mutex_);
  while (running_ || !queue_.empty()) {
    if (!running_) {
      run_front();
      continue;
    }
    strata::wait(&changed_, &mutex_);
  }
}

void OrderedExecutor::work() {
  MutexLock lock(&mutex_);
  while (true) {
    if (!running_ && !queue_.empty()) {
      const absl::Duration waited = absl::Now() - queue_.front().queued;
      if (stopping_ || waited >= kWaiterGrace) {
        run_front();
      } else {
        wait_with_timeout(&changed_, &mutex_, kWaiterGrace - waited);
      }
      continue;
    }
    if (stopping_ && queue_.empty() && !running_) return;
    strata::wait(&changed_, &mutex_);
  }
}

}  // namespace strata::comm_internal
