// The NCCL backend: CUDA buffers, ordered on the caller's stream without a host wait. Built where
// CMake finds CUDA and NCCL (STRATA_HAVE_NCCL); its .cc and nccl_support.{h,cc} are the only
// strata files that include nccl.h, and this header keeps it out of everyone else's. A watchdog
// thread turns an operation that does not finish within STRATA_COMM_TIMEOUT, or an asynchronous
// NCCL error, into ncclCommAbort and the job monitor's cross-rank error.
#pragma once

#include <absl/status/statusor.h>

#include <memory>

#include "strata/comm/communicator.h"

namespace strata::comm_internal {

// options.device must be a CUDA device; it must outlive the communicator.
class JobMonitor;

// `monitor`: the job's rendezvous, joined by Communicator::create.
absl::StatusOr<std::unique_ptr<Communicator>> create_nccl_communicator(
    const CommOptions& options, std::unique_ptr<JobMonitor> monitor);

}  // namespace strata::comm_internal
