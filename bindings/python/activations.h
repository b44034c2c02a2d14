// strata.ActivationStash (activations.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace strata::python {

void bind_activations(pybind11::module_& m);

}  // namespace strata::python
