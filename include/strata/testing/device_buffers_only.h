// Test hook for the collectives' callers: a communicator that takes device buffers only, as NCCL
// does, on any machine. It wraps a working communicator (Gloo on the host backend in the tests)
// and refuses every buffer that is not `device`'s own memory (Device::memory_kind), before the
// call takes a sequence number; needs_device_buffers() is true. So a caller's path for backends
// that move device memory only (the Python collectives' bounce of host arrays) runs without a
// GPU, and a host pointer that slips through is an error, as it would be on NCCL.
#pragma once

#include <memory>

#include "strata/comm/communicator.h"

namespace strata {
class Device;
}  // namespace strata

namespace strata::testing {

// `comm`'s collectives, refusing buffers that are not `device`'s memory. `device` must outlive
// the result. Sub-communicators (split) are wrapped alike.
std::unique_ptr<Communicator> device_buffers_only(std::unique_ptr<Communicator> comm,
                                                  Device& device);

}  // namespace strata::testing
