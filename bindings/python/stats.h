// Stats and configuration as Python dicts.
#pragma once

#include <pybind11/pybind11.h>

#include "strata/config/config.h"
#include "strata/optimizer/offload_optimizer.h"
#include "strata/runtime/runtime.h"
#include "strata/store/tensor_store.h"

namespace strata::python {

pybind11::dict store_stats(const StoreStats& s);
pybind11::dict config_dict(const ResolvedConfig& c);
// Runtime::startup(): the time to create, the CPU tier's pinning and io_uring registration.
pybind11::dict startup_dict(const StartupStats& s);
pybind11::dict optimizer_stats(const OffloadOptimizerStats& s);

}  // namespace strata::python
