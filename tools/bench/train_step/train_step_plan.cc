#include "bench/train_step/train_step_plan.h"

#include <algorithm>
#include <limits>
#include <map>

#include "bench/train_step/train_step.h"

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
    PlannedLayer l{"forward", {{index(i, LayerTensor::kWeight), false}}, o.compute_ms, i};
    if (activations) l.accesses.push_back({index(i, LayerTensor::kActivation), true, true});
    plan.push_back(std::move(l));
  }
  for (uint64_t i = o.layers; i-- > 0;) {
    PlannedLayer l{"backward", {}, o.compute_ms, i};
    if (activations) {
      l.accesses.push_back({index(i, LayerTensor::kActivation), false, false, o.discard});
    }
    l.accesses.push_back({index(i, LayerTensor::kWeight), false});
    if (o.optimizer) l.accesses.push_back({index(i, LayerTensor::kGradient), true, true});
    plan.push_back(std::move(l));
  }
  if (o.optimizer) {
    for (uint64_t i = 0; i < o.layers; ++i) {
      plan.push_back({"optimizer",
                      {{index(i, LayerTensor::kGradient), false, false, o.discard},
                       {index(i, LayerTensor::kWeight), true}},
                      o.optimizer_ms,
                      i});
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
    it->second.dirty = (it->second.dirty || a.write) && !a.last_use;
  }
  return last;
}

ArenaBound arena_bound(const std::vector<PlannedLayer>& plan,
                       const std::vector<uint64_t>& footprint, uint64_t capacity,
                       double link_bytes_per_second) {
  ArenaBound best;
  const size_t n = plan.size();
  if (n == 0) return best;
  double total_ms = 0;
  std::vector<double> before_ms(n, 0);  // layers [0, k)
  for (size_t k = 0; k < n; ++k) {
    before_ms[k] = total_ms;
    total_ms += plan[k].compute_ms;
  }
  // From the last layer back: each tensor's first access in layers [k, n) is the earliest one
  // seen so far, and fetch_after(k) is kept as a running sum over the tensors whose first
  // access needs bytes.
  enum : uint8_t { kUnseen, kFetch, kOverwrite };
  std::vector<uint8_t> first(footprint.size(), kUnseen);
  uint64_t fetch_after = 0;
  double after_ms = 0;
  for (size_t k = n; k-- > 0;) {
    const std::vector<PlannedAccess>& accesses = plan[k].accesses;
    for (auto a = accesses.rbegin(); a != accesses.rend(); ++a) {
      const uint8_t now = a->overwrite ? kOverwrite : kFetch;
      uint8_t& was = first[a->tensor];
      if (was == kFetch && now != kFetch) fetch_after -= footprint[a->tensor];
      if (was != kFetch && now == kFetch) fetch_after += footprint[a->tensor];
      was = now;
    }
    after_ms += plan[k].compute_ms;
    const uint64_t cross = fetch_after > capacity ? fetch_after - capacity : 0;
    const double cross_seconds =
        link_bytes_per_second > 0 ? static_cast<double>(cross) / link_bytes_per_second : 0;
    const double after_seconds = after_ms * 1e-3;
    // before + max(after, cross) written as total + max(0, cross - after): exactly the total
    // compute where the transfer fits behind the compute.
    const double seconds = total_ms * 1e-3 + std::max(0.0, cross_seconds - after_seconds);
    // >=: walking back, a tie keeps the earliest cut.
    if (k == n - 1 || seconds >= best.seconds) {
      best.seconds = seconds;
      best.cut = k;
      best.compute_before_seconds = before_ms[k] * 1e-3;
      best.compute_after_seconds = after_seconds;
      best.fetch_after_bytes = fetch_after;
      best.cross_after_bytes = cross;
      best.where = std::string(plan[k].pass) + " " + std::to_string(plan[k].layer);
    }
  }
  return best;
}

}  // namespace strata::bench
