// strata._strata: the C++ runtime for Python (pybind11), with DLPack views of acquired tensors.
// The pure-Python package around it is bindings/python/strata/; docs/python.md describes both.
//
// One file per class or concern, this one only assembles the module:
//   errors        absl::Status -> strata.Error and its subclasses
//   names         tiers, access modes, dtypes
//   environment   STRATA_* variables and Runtime(**overrides)
//   runtime       strata.Runtime
//   stream        strata.Stream and the DLPack `stream` argument
//   tensor        strata.Tensor
//   acquisition   strata.Acquisition: acquire, release, the stream protocol
//   dlpack_export the 'dltensor' capsule
//   host_array    arrays in and out through the buffer protocol and DLPack (never numpy's C API)
//   stats         stats and configuration as dicts
//   optimizer     strata.OffloadOptimizer
//   comm          strata.Communicator
//   zero          strata.ZeroEngine (float16: the host's fp16/bf16 conversions)
//   activations   strata.ActivationStash
//   testing       strata._strata.testing: host-backend test hooks (stream gates)
// The GIL is released around every call that may block (acquire, release, flush, step, ...).
#include <pybind11/pybind11.h>

#include "acquisition.h"
#include "activations.h"
#include "comm.h"
#include "errors.h"
#include "host_array.h"
#include "names.h"
#include "optimizer.h"
#include "runtime.h"
#include "stream.h"
#include "tensor.h"
#include "testing.h"
#include "zero.h"

PYBIND11_MODULE(_strata, m) {
  m.doc() = "strata: a heterogeneous memory runtime for deep-learning training (C++ core)";
  strata::python::bind_errors(m);
  strata::python::bind_host_array(m);
  strata::python::bind_runtime(m);
  strata::python::bind_stream(m);
  strata::python::bind_tensor(m);
  strata::python::bind_acquisition(m);
  strata::python::bind_optimizer(m);
  strata::python::bind_comm(m);
  strata::python::bind_zero(m);
  strata::python::bind_activations(m);
  strata::python::bind_testing(m);
  // The size parser every `*_bytes` argument goes through, for the pure-Python layers.
  m.def(
      "parse_size",
      [](const pybind11::object& value, const std::string& what, bool allow_zero) {
        return strata::python::size_arg(value, what.c_str(), allow_zero);
      },
      pybind11::arg("value"), pybind11::arg("what") = "size", pybind11::arg("allow_zero") = true,
      "A byte count from an int or a size string ('64KiB', '1.5GiB'); InvalidArgumentError "
      "naming `what` otherwise.");
}
