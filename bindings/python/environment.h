// The environment a Python Runtime is built from: the STRATA_* variables of os.environ, with
// Runtime(**overrides) applied (gpu_bytes="64MiB" sets STRATA_GPU_BYTES; None unsets).
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>

namespace strata::python {

std::map<std::string, std::string> runtime_variables(const pybind11::kwargs& overrides);

}  // namespace strata::python
