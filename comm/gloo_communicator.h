// The Gloo backend: host buffers, any machine. Collectives run in issue order on one worker
// thread per communicator (Gloo's calls block); each returns a work handle at once.
#pragma once

#include <absl/status/statusor.h>

#include <memory>

#include "strata/comm/communicator.h"

namespace strata::comm_internal {

class JobMonitor;

// `monitor`: the job's rendezvous, joined by Communicator::create.
absl::StatusOr<std::unique_ptr<Communicator>> create_gloo_communicator(
    const CommOptions& options, std::unique_ptr<JobMonitor> monitor);

}  // namespace strata::comm_internal
