// Helpers for AccessSchedule's tests: accesses written briefly, a step run through the schedule,
// the tensors due now.
#pragma once

#include <initializer_list>
#include <vector>

#include "strata/store/access_schedule.h"

namespace strata::testing {

inline Access gpu(TensorId tensor) { return Access{tensor, TierKind::kGpu}; }
inline Access cpu(TensorId tensor) { return Access{tensor, TierKind::kCpu}; }

inline std::vector<Access> gpu_order(std::initializer_list<TensorId> tensors) {
  std::vector<Access> order;
  for (const TensorId t : tensors) order.push_back(gpu(t));
  return order;
}

inline void acquire_all(AccessSchedule& schedule, const std::vector<Access>& accesses) {
  for (const Access& a : accesses) schedule.on_acquire(a);
}

inline void run_step(AccessSchedule& schedule, const std::vector<Access>& accesses) {
  schedule.step_begin();
  acquire_all(schedule, accesses);
  schedule.step_end();
}

inline std::vector<TensorId> due_tensors(const AccessSchedule& schedule, size_t max = 100) {
  std::vector<TensorId> tensors;
  for (const DueAccess& d : schedule.due(max)) tensors.push_back(d.access.tensor);
  return tensors;
}

using Tensors = std::vector<TensorId>;

}  // namespace strata::testing
