// strata.Communicator: the ranks of a data-parallel job (include/strata/comm/communicator.h),
// on a Runtime's device when one is given.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "runtime.h"
#include "strata/base/mutex.h"
#include "strata/comm/communicator.h"
#include "strata/device/device.h"

namespace strata::python {

class PyCommunicator {
 public:
  PyCommunicator(std::shared_ptr<PyRuntime> rt_, std::unique_ptr<Communicator> comm_)
      : rt(std::move(rt_)), comm(std::move(comm_)) {}
  ~PyCommunicator() {
    pybind11::gil_scoped_release unlocked;  // leaving the job waits for issued collectives
    comm.reset();
  }
  std::shared_ptr<PyRuntime> rt;  // null: no device (host buffers, no stream ordering)
  std::unique_ptr<Communicator> comm;
  // Where `comm` takes device buffers only (NCCL), the collectives move host arrays through
  // device memory of rt's device (comm.cc, bounced()): this memory and stream, made on first
  // need and kept while small. Declared after rt: destroyed before its device.
  absl::Mutex bounce_mutex;
  std::unique_ptr<DeviceMemory> bounce_memory ABSL_GUARDED_BY(bounce_mutex);
  std::unique_ptr<Stream> bounce_stream ABSL_GUARDED_BY(bounce_mutex);
};

void bind_comm(pybind11::module_& m);

}  // namespace strata::python
