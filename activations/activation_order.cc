#include "activation_order.h"

namespace strata {

void ActivationOrder::on_load(uint32_t save_index, uint64_t bytes) {
  if (!step_seen_.emplace(save_index, true).second) return;  // a second load (retain_graph)
  step_loads_.push_back(save_index);
  step_bytes_.push_back(bytes);
}

bool ActivationOrder::close_step() {
  bool changed = false;
  // A step without loads (evaluation, a forward that failed) says nothing about backward.
  if (!step_loads_.empty() && step_loads_ != order_) {
    order_ = step_loads_;
    through_.assign(order_.size(), 0);
    position_.clear();
    uint64_t sum = 0;
    for (size_t i = 0; i < order_.size(); ++i) {
      sum += step_bytes_[i];
      through_[i] = sum;
      position_[order_[i]] = i;
    }
    changed = true;
  }
  step_loads_.clear();
  step_bytes_.clear();
  step_seen_.clear();
  return changed;
}

std::optional<uint32_t> ActivationOrder::next_after(uint32_t save_index) const {
  if (auto it = position_.find(save_index); it != position_.end()) {
    if (it->second + 1 < order_.size()) return order_[it->second + 1];
    return std::nullopt;
  }
  if (save_index == 0) return std::nullopt;
  return save_index - 1;
}

std::optional<uint64_t> ActivationOrder::bytes_through(uint32_t save_index) const {
  auto it = position_.find(save_index);
  if (it == position_.end()) return std::nullopt;
  return through_[it->second];
}

}  // namespace strata
