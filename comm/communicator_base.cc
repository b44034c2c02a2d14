#include "communicator_base.h"

#include "strata/base/text.h"
#include "strata/config/comm_settings.h"

namespace strata::comm_internal {

using text::cat;
using text::to_absl;

bool Health::begin_failure() {
  MutexLock lock(&mutex_);
  if (failing_) return false;
  failing_ = true;
  return true;
}

bool Health::failing() const {
  MutexLock lock(&mutex_);
  return failing_;
}

void Health::set_verdict(absl::Status error) {
  MutexLock lock(&mutex_);
  failing_ = true;
  if (verdict_.ok()) verdict_ = std::move(error);
  written_.SignalAll();
}

absl::Status Health::verdict() const {
  MutexLock lock(&mutex_);
  return verdict_;
}

absl::Status Health::await_verdict(absl::Duration bound) const {
  MutexLock lock(&mutex_);
  const absl::Time deadline = absl::Now() + bound;
  while (verdict_.ok() && absl::Now() < deadline) {
    (void)wait_with_timeout(&written_, &mutex_, deadline - absl::Now());
  }
  return verdict_;
}

CommunicatorBase::CommunicatorBase(const CommOptions& options, std::unique_ptr<JobMonitor> monitor)
    : options_(options), monitor_(std::move(monitor)) {
  options_.launch.master_port = monitor_->launch().master_port;
}

CommunicatorBase::~CommunicatorBase() = default;

CommStats CommunicatorBase::stats() const {
  MutexLock lock(&mutex_);
  return stats_;
}

std::string CommunicatorBase::description() const {
  return cat(engine(), ", rank ", rank(), " of ", size(), ", rendezvous at ",
             options_.launch.master_addr, ":", options_.launch.master_port, ", timeout ",
             format_duration(settings().timeout), settings().debug ? ", signatures checked" : "",
             split_note_.empty() ? "" : " ", split_note_);
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> CommunicatorBase::all_gather(
    const void* send, void* recv, std::span<const uint64_t> counts, DataType type,
    const CollectiveOptions& options) {
  Operation op{CollectiveCall::of(CollectiveKind::kAllGather, type), send, recv};
  op.call.counts.assign(counts.begin(), counts.end());
  return issue(std::move(op), options);
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> CommunicatorBase::reduce_scatter(
    const void* send, void* recv, std::span<const uint64_t> counts, DataType type, ReduceOp op,
    const CollectiveOptions& options) {
  Operation operation{CollectiveCall::of(CollectiveKind::kReduceScatter, type, op), send, recv};
  operation.call.counts.assign(counts.begin(), counts.end());
  return issue(std::move(operation), options);
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> CommunicatorBase::all_reduce(
    const void* send, void* recv, uint64_t count, DataType type, ReduceOp op,
    const CollectiveOptions& options) {
  Operation operation{CollectiveCall::of(CollectiveKind::kAllReduce, type, op), send, recv};
  operation.call.counts = {count};
  return issue(std::move(operation), options);
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> CommunicatorBase::broadcast(
    void* data, uint64_t count, DataType type, int root, const CollectiveOptions& options) {
  Operation op{CollectiveCall::of(CollectiveKind::kBroadcast, type), data, data};
  op.call.root = root;
  op.call.counts = {count};
  return issue(std::move(op), options);
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> CommunicatorBase::barrier(
    const CollectiveOptions& options) {
  return issue(Operation{CollectiveCall::of(CollectiveKind::kBarrier, DataType::kUInt8)}, options);
}

absl::StatusOr<std::unique_ptr<CollectiveWork>> CommunicatorBase::issue(
    Operation op, const CollectiveOptions& options) {
  if (absl::Status s = check_options(options); !s.ok()) return s;
  {
    MutexLock lock(&mutex_);
    if (!health_->failing()) {
      op.call.sequence = sequence_ + 1;  // taken only by a call that passes the checks
      if (absl::Status s = check_counts(op.call, size()); !s.ok()) return s;
      ++sequence_;
      add_to_stats(stats_, op.call, size(), rank());
      monitor_->issued(op.call);
      return start(op, options);
    }
  }
  return broken_error();  // waited for outside the issue lock
}

absl::Status CommunicatorBase::fail(const CollectiveCall& call, std::string_view local) {
  if (!health_->begin_failure()) return broken_error();
  abort_transport();
  return finish_failure(monitor_->post_mortem(call, local));
}

absl::Status CommunicatorBase::fail_with(absl::Status verdict) {
  if (!health_->begin_failure()) return broken_error();
  abort_transport();
  return finish_failure(std::move(verdict));
}

absl::Status CommunicatorBase::finish_failure(absl::Status error) {
  if (!split_note_.empty() && !error.ok()) {
    error = absl::Status(error.code(), to_absl(cat(error.message(), " ", split_note_)));
  }
  health_->set_verdict(std::move(error));
  const absl::Status verdict = health_->verdict();
  on_broken(verdict);
  return verdict;
}

absl::Status CommunicatorBase::broken_error() const {
  // The failing thread's post-mortem is a bounded exchange (well within the timeout).
  const absl::Duration bound = absl::FromChrono(settings().timeout) + absl::Seconds(10);
  if (absl::Status verdict = health_->await_verdict(bound); !verdict.ok()) return verdict;
  return absl::InternalError(
      "the communicator failed and the report of its failure did not come: create a new one");
}

absl::Status CommunicatorBase::check_signatures(const CollectiveCall& call,
                                                const CollectiveOptions& options) {
  absl::StatusOr<std::vector<CollectiveCall::Signature>> all = exchange_signatures(call, options);
  if (!all.ok()) return fail(call, cat("the signature check: ", all.status().message()));
  if (all->size() != static_cast<size_t>(size())) {
    return fail(call, cat("the signature check returned ", all->size(), " signatures for ", size(),
                          " ranks"));
  }
  const CollectiveCall::Signature mine = call.signature();
  for (const CollectiveCall::Signature& theirs : *all) {
    if (theirs != mine) {
      return fail_with(absl::FailedPreconditionError(to_absl(
          cat(call.describe(), " on rank ", rank(), ": ", mismatch_message(*all, rank())))));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::comm_internal
