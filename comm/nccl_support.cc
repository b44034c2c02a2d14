#include "nccl_support.h"

#include <cstring>
#include <vector>

#include "strata/base/text.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

constexpr std::string_view kIdKey = "strata/nccl/id";
std::string arrived_key(int rank) { return cat("strata/nccl/arrived/", rank); }

// The ranks that never reached NCCL's set-up and the ones that died, for the timeout message.
std::string absent_ranks(TcpStore& store, int world_size) {
  std::vector<int> absent;
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<bool> present = store.check({arrived_key(r)});
    if (present.ok() && !*present) absent.push_back(r);
  }
  std::string message;
  if (!absent.empty()) {
    message = cat(" Rank(s) ", text::join(absent, ", "), " never reached NCCL's set-up.");
  }
  absl::StatusOr<std::vector<int>> lost = store.lost_ranks();
  if (lost.ok() && !lost->empty()) {
    message += cat(" Rank(s) ", text::join(*lost, ", "), " exited or were killed.");
  }
  if (message.empty()) {
    message =
        " Every rank reached it: NCCL could not connect them (check the network between the "
        "machines, NCCL_SOCKET_IFNAME; NCCL_DEBUG=INFO tells more).";
  }
  return message;
}

}  // namespace

std::string nccl_error(ncclResult_t result, std::string_view what) {
  std::string message = cat(what, " failed: ", nccl().GetErrorString(result));
  const char* last = nccl().GetLastError(nullptr);
  if (last != nullptr && *last != '\0') message += cat(" (", last, ")");
  return message;
}

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
    case DataType::kUInt8:
      return ncclUint8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

absl::Status NcclWork::wait() {
  if (std::optional<absl::Status> r = state_->result(); r.has_value() && !r->ok()) return *r;
  return health_->verdict();
}

absl::Status NcclWork::synchronize() {
  const auto deadline = Clock::now() + 2 * timeout_ + std::chrono::seconds(5);
  Backoff backoff;
  while (true) {
    if (std::optional<absl::Status> r = state_->result()) return *r;
    if (absl::Status broken = health_->verdict(); !broken.ok()) return broken;
    absl::StatusOr<bool> done = end_ == nullptr ? true : device_.query(*end_);
    if (!done.ok()) {
      return absl::InternalError(to_absl(cat(what_, ": ", done.status().message())));
    }
    // Done — unless an abort ended it, which the health tells.
    if (*done) return health_->verdict();
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          to_absl(cat(what_,
                      " did not finish within twice STRATA_COMM_TIMEOUT and the "
                      "watchdog did not end it: the GPU or NCCL is stuck; stop the job")));
    }
    backoff.pause();
  }
}

absl::StatusOr<ncclComm_t> nccl_rendezvous(const LaunchInfo& launch, const CommSettings& settings,
                                           TcpStore& store, const GpuIdentity& gpu) {
  const std::string who = cat("rank ", launch.rank, " of ", launch.world_size);
  absl::StatusOr<std::vector<GpuIdentity>> gpus =
      exchange_gpu_identities(store, launch.rank, launch.world_size, gpu);
  if (!gpus.ok()) return gpus.status();
  if (absl::Status s = check_one_gpu_per_rank(*gpus); !s.ok()) return s;
  // Rank 0 makes the unique id; the others read it from the rendezvous.
  ncclUniqueId id{};
  if (launch.rank == 0) {
    if (ncclResult_t r = nccl().GetUniqueId(&id); r != ncclSuccess) {
      return absl::UnavailableError(to_absl(cat(who, ": ", nccl_error(r, "ncclGetUniqueId"))));
    }
    if (absl::Status s = store.set(kIdKey, std::string_view(id.internal, sizeof(id.internal)));
        !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> value = store.get(kIdKey);
    if (!value.ok()) {
      return absl::Status(
          value.status().code(),
          to_absl(cat(who, " did not receive NCCL's unique id from rank 0 (", launch.master_addr,
                      ":", launch.master_port, "): ", value.status().message())));
    }
    if (value->size() != sizeof(id.internal)) {
      return absl::InternalError(
          to_absl(cat(who, ": NCCL's unique id from the rendezvous has ", value->size(),
                      " bytes instead of ", sizeof(id.internal), ": is every rank this build?")));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }
  if (absl::Status s = store.set(arrived_key(launch.rank), "1"); !s.ok()) return s;

  // Non-blocking set-up, polled: a rank that never comes is a timeout, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result =
      nccl().CommInitRankConfig(&comm, launch.world_size, id, launch.rank, &config);
  const auto deadline = Clock::now() + settings.timeout;
  Backoff backoff;
  while (result == ncclInProgress && comm != nullptr && Clock::now() < deadline) {
    backoff.pause();
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = nccl().CommGetAsyncError(comm, &async);
    result = r != ncclSuccess ? r : async;
  }
  if (result != ncclSuccess) {
    if (comm != nullptr) (void)nccl().CommAbort(comm);
    if (result == ncclInProgress) {
      return absl::DeadlineExceededError(to_absl(
          cat(who, ": NCCL's set-up did not finish within STRATA_COMM_TIMEOUT (",
              format_duration(settings.timeout), ").", absent_ranks(store, launch.world_size))));
    }
    return absl::UnavailableError(
        to_absl(cat(who, ": ", nccl_error(result, "ncclCommInitRankConfig"), ".",
                    absent_ranks(store, launch.world_size))));
  }
  return comm;
}

absl::StatusOr<ncclComm_t> nccl_split(ncclComm_t parent, int color, int key,
                                      const CommSettings& settings, std::string_view who) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  ncclResult_t result = nccl().CommSplit(parent, color, key, &child, &config);
  const auto deadline = Clock::now() + settings.timeout;
  Backoff backoff;
  // A non-blocking split is in progress on both communicators until the child is ready.
  while (result == ncclInProgress && Clock::now() < deadline) {
    backoff.pause();
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = nccl().CommGetAsyncError(parent, &async);
    if (r == ncclSuccess && async != ncclInProgress && async != ncclSuccess) r = async;
    if (r == ncclSuccess && child != nullptr) {
      r = nccl().CommGetAsyncError(child, &async);
      if (r == ncclSuccess) r = async;
    }
    result = r;
  }
  if (result != ncclSuccess) {
    if (child != nullptr) (void)nccl().CommAbort(child);
    if (result == ncclInProgress) {
      return absl::DeadlineExceededError(
          to_absl(cat(who, ": ncclCommSplit did not finish within STRATA_COMM_TIMEOUT (",
                      format_duration(settings.timeout), "): a rank of the parent did not split")));
    }
    return absl::UnavailableError(to_absl(cat(who, ": ", nccl_error(result, "ncclCommSplit"))));
  }
  return child;
}

}  // namespace strata::comm_internal
