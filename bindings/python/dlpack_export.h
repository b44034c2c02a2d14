// DLPack export: a 'dltensor' capsule viewing an Acquisition's memory (zero copy). The capsule's
// DLManagedTensor keeps the Python Acquisition object alive (not the acquisition itself: that
// ends with the `with` block or release()). Stream ordering is the caller's (acquisition.h).
#pragma once

#include <pybind11/pybind11.h>

namespace strata::python {

// `acquisition` is a Python strata.Acquisition.
pybind11::capsule to_dlpack(const pybind11::object& acquisition);

}  // namespace strata::python
