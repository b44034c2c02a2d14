// strata.OffloadOptimizer: ZeRO-Offload's optimizer over a Runtime's tensors.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime.h"
#include "strata/optimizer/offload_optimizer.h"

namespace strata::python {

class PyOptimizer {
 public:
  PyOptimizer(std::shared_ptr<PyRuntime> rt_, std::unique_ptr<OffloadOptimizer> opt_)
      : rt(std::move(rt_)), opt(std::move(opt_)) {}
  ~PyOptimizer() {
    pybind11::gil_scoped_release unlocked;
    opt.reset();
  }
  std::shared_ptr<PyRuntime> rt;  // outlives opt
  std::unique_ptr<OffloadOptimizer> opt;
  std::vector<uint64_t> counts;  // by ParamId
};

// Group keywords (lr, betas, eps, weight_decay, decoupled) applied to `g`; another key raises.
void apply_group_kwargs(AdamGroup& g, const pybind11::dict& kwargs);
// A group as the dict group() returns (lr, betas, eps, weight_decay, decoupled).
pybind11::dict group_dict(const AdamGroup& g);
// A StepResult as the dict step() returns.
pybind11::dict step_result_dict(const StepResult& r);

void bind_optimizer(pybind11::module_& m);

}  // namespace strata::python
