// Runs tasks one at a time, in submission order, on a worker thread — or on the thread that
// waits for one: a waiter whose task has not started runs the tasks up to and including its
// own itself, so an issue followed at once by a wait costs no hand-off between threads (two
// wake-ups per call, which on a loaded machine cost more than a 1 MiB collective). The worker
// leaves a task alone for its first kWaiterGrace, the window in which an issue-then-wait caller
// reaches wait(); a task nobody waits for starts that much later, which only a caller that
// overlaps it with other work (and so does not mind) sees.
#pragma once

#include <absl/status/status.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <deque>
#include <functional>
#include <memory>
#include <thread>

namespace strata::comm_internal {

class OrderedExecutor {
 public:
  static constexpr absl::Duration kWaiterGrace = absl::Microseconds(200);

  using Task = std::function<absl::Status()>;
  struct Ticket;  // one submitted task's outcome

  OrderedExecutor();
  // Runs every task already submitted, then stops the worker.
  ~OrderedExecutor();
  OrderedExecutor(const OrderedExecutor&) = delete;
  OrderedExecutor& operator=(const OrderedExecutor&) = delete;

  std::shared_ptr<Ticket> submit(Task task);
  // Returns once every task submitted so far has run (helping, as wait() does).
  void drain();
  // The task's status once it has run; DeadlineExceeded if it has not after `backstop`.
  absl::Status wait(const std::shared_ptr<Ticket>& ticket, absl::Duration backstop);

 private:
  struct Entry {
    Task task;
    std::shared_ptr<Ticket> ticket;
    absl::Time queued;
  };
  void work();
  // Runs the front task; `mutex_` is held on entry and exit, released while the task runs.
  void run_front() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  absl::Mutex mutex_;
  absl::CondVar changed_;  // a task was queued, finished, or stopping was asked
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mutex_);
  bool running_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread worker_;
};

struct OrderedExecutor::Ticket {
  bool done = false;  // guarded by the executor's mutex
  absl::Status status;
};

}  // namespace strata::comm_internal
