// strata.Communicator: the ranks of a data-parallel job (include/strata/comm/communicator.h),
// on a Runtime's device when one is given.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "runtime.h"
#include "strata/comm/communicator.h"

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
};

void bind_comm(pybind11::module_& m);

}  // namespace strata::python
