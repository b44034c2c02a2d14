// strata.Acquisition: a tensor's memory in one tier until release(), and the stream protocol
// around it.
//
// Nothing here blocks the host on a device copy except where a host consumer must read:
//   acquire()   the store makes strata's stream wait for the copy (NVMe reads excepted, which the
//               store does on the host); a `ready` event is recorded on strata's stream.
//   __dlpack__  the consumer's stream waits on `ready` (device-side); stream=None on the host
//               backend means a host consumer, which waits for `ready` on the host.
//   release()   the store records the end of the consumer's work on the consumer's stream (the
//               one given, else those seen at __dlpack__), so the memory is reused only after it.
// CPU-tier acquisitions are ready for the host when acquire() returns (the store settles them).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dlpack.h"
#include "tensor.h"

namespace strata::python {

class Acquisition {
 public:
  Acquisition(std::shared_ptr<PyTensor> tensor_, void* data_, TierKind tier_, AccessMode mode_,
              std::unique_ptr<Event> ready_)
      : tensor(std::move(tensor_)),
        data(data_),
        tier(tier_),
        mode(mode_),
        ready(std::move(ready_)) {}
  ~Acquisition();

  // Makes the consumer's stream (a parse_stream argument) wait until the memory is ready.
  void order_consumer(const pybind11::handle& stream);
  void release(const pybind11::handle& stream);
  void check_live() const;
  DLDevice dl_device() const;

  std::shared_ptr<PyTensor> tensor;
  void* data;
  TierKind tier;
  AccessMode mode;
  std::unique_ptr<Event> ready;      // recorded on strata's stream; null for the CPU tier
  std::vector<uintptr_t> consumers;  // streams that waited at __dlpack__, by native handle
  bool released = false;
  // Gives the memory back, ordered after the work on the stream (called without the GIL).
  // Unset: the store's release of tensor->handle. A ZeroEngine's acquisitions set it
  // (release_param, grad_ready).
  std::function<absl::Status(Stream&)> release_with;
  // Kept alive as long as this acquisition (and so any DLPack view of it): what must not go
  // before the memory is given back (strata.torch's saved-activation handle).
  pybind11::object keep_alive;
};

std::shared_ptr<Acquisition> acquire(const std::shared_ptr<PyTensor>& tensor,
                                     const std::string& tier, const std::string& mode);

// An event recorded on strata's stream where acquired GPU-tier memory is ready: consumers wait
// on it at __dlpack__, the host for stream=None on the host backend.
absl::StatusOr<std::unique_ptr<Event>> ready_event(PyRuntime& rt);

void bind_acquisition(pybind11::module_& m);

}  // namespace strata::python
