// The order in which backward loads a step's activations, keyed by save index (the n-th
// activation saved since the step began), for ActivationStash's prefetch and keep_tail.
//
// Until a step has been seen, backward is assumed to use the activations in the reverse of the
// forward order. Each step records the save indices in the order of their first load; when a
// step ends with loads in another order than the recorded one, its order replaces it (a model
// whose path changed, a branch taken). Thread-compatible: the stash calls it under its lock.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace strata {

class ActivationOrder {
 public:
  // The first load of `save_index` in the current step, of `bytes`.
  void on_load(uint32_t save_index, uint64_t bytes);
  // Ends the step: true when its loads replaced the order (or were the first recorded).
  bool close_step();

  bool has_order() const { return !order_.empty(); }
  // The save index backward loads after `save_index`: the recorded order's next entry (nullopt
  // at its end, or when the recorded order does not know `save_index` and `save_index` is 0),
  // else the previous save index (the forward order reversed).
  std::optional<uint32_t> next_after(uint32_t save_index) const;
  // The bytes backward loads up to and including `save_index`, by the recorded order's sizes;
  // nullopt without an order or when it does not know `save_index`.
  std::optional<uint64_t> bytes_through(uint32_t save_index) const;

 private:
  std::vector<uint32_t> order_;                     // save indices in load order
  std::vector<uint64_t> through_;                   // through_[i]: bytes of order_[0..i]
  absl::flat_hash_map<uint32_t, size_t> position_;  // save index -> index in order_
  std::vector<uint32_t> step_loads_;                // this step's first loads
  std::vector<uint64_t> step_bytes_;
  absl::flat_hash_map<uint32_t, bool> step_seen_;
};

}  // namespace strata
