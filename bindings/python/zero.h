// strata.ZeroEngine: ZeRO-DP stages 1, 2 and 3 (include/strata/zero/zero_engine.h) for Python:
// parameters given as numpy arrays, read back as copies or acquired as DLPack views, gradients
// added from numpy arrays or written through acquire_grad() views.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "comm.h"
#include "runtime.h"
#include "strata/zero/zero_engine.h"

namespace strata::python {

class PyZeroEngine {
 public:
  PyZeroEngine(std::shared_ptr<PyRuntime> rt_, std::shared_ptr<PyCommunicator> comm_,
               std::unique_ptr<ZeroEngine> engine_)
      : rt(std::move(rt_)), comm(std::move(comm_)), engine(std::move(engine_)) {}
  ~PyZeroEngine() {
    pybind11::gil_scoped_release unlocked;
    engine.reset();
  }
  std::shared_ptr<PyRuntime> rt;         // outlives engine
  std::shared_ptr<PyCommunicator> comm;  // outlives engine
  std::unique_ptr<ZeroEngine> engine;
};

void bind_zero(pybind11::module_& m);

}  // namespace strata::python
