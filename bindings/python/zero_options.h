// strata.ZeroOptions (and the structs it holds: OffloadOptimizerOptions, AdamGroup, LossScaling)
// bound field by field, readwrite, as include/strata/zero/zero_engine.h declares them: what
// strata.ZeroEngine is created with, and what strata.torch.zero_shard's policy objects fill.
#pragma once

#include <pybind11/pybind11.h>

#include "strata/zero/zero_engine.h"

namespace strata::python {

// `options` (a strata.ZeroOptions or None: the defaults) copied, with `fields` set over it: any
// ZeroOptions attribute by name, and the optimizer's by their short names (lr, betas, eps,
// weight_decay, decoupled, max_grad_norm, skip_on_overflow, chunk_elements, state_home,
// loss_scale, dynamic_loss_scale, groups). An unknown name or a bad value raises, naming it.
ZeroOptions zero_options_from(const pybind11::object& options, const pybind11::kwargs& fields);

void bind_zero_options(pybind11::module_& m);

}  // namespace strata::python
