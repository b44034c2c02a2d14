#include "bench/train_step_plan.h"

#include <algorithm>
#include <limits>
#include <map>

#include "bench/train_step.h"

namespace strata::bench {

std::vector<LayerTensor> layer_tensors(const TrainStepOptions& o) {
  std::vector<LayerTensor> kinds = {LayerTensor::kWeight};
  if (o.activation_bytes > 0) kinds.push_back(LayerTensor::kActivation);
  if (o.optimizer) kinds.push_back(LayerTensor::kGradient);
  return kinds;
}

uint64_t tensor_bytes(const TrainStepOptions& o, LayerTensor kind) {
  // A gradient has its weight's shape and dtype.
  return kind == LayerTensor::kActivation ? o.activation_bytes : o.layer_bytes;
}

std::vector<PlannedLayer> step_plan(const TrainStepOptions& o) {
  const std::vector<LayerTensor> kinds = layer_tensors(o);
  auto index = [&](uint64_t layer, LayerTensor kind) -> uint64_t {
    const auto at = std::find(kinds.begin(), kinds.end(), kind) - kinds.begin();
    return layer * kinds.size() + static_cast<uint64_t>(at);
  };
  const bool activations = o.activation_bytes > 0;
  std::vector<PlannedLayer> plan;
  for (uint64_t i = 0; i < o.layers; ++i) {
    PlannedLayer l{"forward", {{index(i, LayerTensor::kWeight), false}}, o.compute_ms};
    if (activations) l.accesses.push_back({index(i, LayerTensor::kActivation), true, true});
    plan.push_back(std::move(l));
  }
  for (uint64_t i = o.layers; i-- > 0;) {
    PlannedLayer l{"backward", {}, o.compute_ms};
    if (activations) l.accesses.push_back({index(i, LayerTensor::kActivation), false});
    l.accesses.push_back({index(i, LayerTensor::kWeight), false});
    if (o.optimizer) l.accesses.push_back({index(i, LayerTensor::kGradient), true, true});
    plan.push_back(std::move(l));
  }
  if (o.optimizer) {
    for (uint64_t i = 0; i < o.layers; ++i) {
      plan.push_back(
          {"optimizer",
           {{index(i, LayerTensor::kGradient), false}, {index(i, LayerTensor::kWeight), true}},
           o.optimizer_ms});
    }
  }
  return plan;
}

PagingModel model_paging(const std::vector<PlannedLayer>& plan,
                         const std::vector<uint64_t>& footprint, uint64_t capacity, bool belady) {
  std::vector<PlannedAccess> step;
  for (const PlannedLayer& l : plan) step.insert(step.end(), l.accesses.begin(), l.accesses.end());
  if (step.empty()) return {};
  // Warm-up steps until the cache is in its steady state (a few suffice: the plan is periodic),
  // then the one reported; next uses look one step further, into the repetition.
  constexpr size_t kSteps = 4;
  const size_t n = step.size();
  const size_t total = (kSteps + 1) * n;
  constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> next(total);
  std::map<uint64_t, uint64_t> seen;
  for (size_t k = total; k-- > 0;) {
    const uint64_t t = step[k % n].tensor;
    auto it = seen.find(t);
    next[k] = it == seen.end() ? kNever : it->second;
    seen[t] = k;
  }
  struct Resident {
    uint64_t last_use = 0;
    uint64_t next_use = 0;
    bool dirty = false;
  };
  std::map<uint64_t, Resident> resident;
  uint64_t used = 0;
  PagingModel last;
  for (size_t k = 0; k < kSteps * n; ++k) {
    if (k % n == 0) last = PagingModel();
    const PlannedAccess& a = step[k % n];
    auto it = resident.find(a.tensor);
    if (it == resident.end()) {
      if (!a.overwrite) {  // an overwrite takes room but brings no bytes
        ++last.misses;
        last.fetched_bytes += footprint[a.tensor];
      }
      while (used + footprint[a.tensor] > capacity && !resident.empty()) {
        auto victim = resident.begin();
        for (auto r = resident.begin(); r != resident.end(); ++r) {
          const bool better = belady ? r->second.next_use > victim->second.next_use
                                     : r->second.last_use < victim->second.last_use;
          if (better) victim = r;
        }
        if (victim->second.dirty) last.written_back_bytes += footprint[victim->first];
        used -= footprint[victim->first];
        resident.erase(victim);
      }
      it = resident.emplace(a.tensor, Resident()).first;
      used += footprint[a.tensor];
    }
    it->second.last_use = k;
    it->second.next_use = next[k];
    it->second.dirty = it->second.dirty || a.write;
  }
  return last;
}

}  // namespace strata::bench
