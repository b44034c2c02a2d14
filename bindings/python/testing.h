// strata._strata.testing: test hooks of the host backend, for tests that show stream ordering
// without timing (docs/python.md). Not part of the API users program against.
#pragma once

#include <pybind11/pybind11.h>

namespace strata::python {

void bind_testing(pybind11::module_& m);

}  // namespace strata::python
