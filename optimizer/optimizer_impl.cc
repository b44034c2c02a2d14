// The small helpers optimizer_impl.h declares for every file of the optimizer: element sizes,
// the fp16/bf16 conversions of master weights and parameters, Completion, and one piece's Adam
// call (the plain step's and the early steps').
#include "optimizer_impl.h"

#include <cstring>

#include "cpu_adam_kernels.h"
#include "strata/base/mutex.h"

namespace strata {

uint64_t element_bytes(ParamType type) { return type == ParamType::kF32 ? 4 : 2; }
uint64_t element_bytes(GradType type) { return type == GradType::kF32 ? 4 : 2; }

ParamCopyType copy_type(ParamType type) {
  switch (type) {
    case ParamType::kF16:
      return ParamCopyType::kF16;
    case ParamType::kBF16:
      return ParamCopyType::kBF16;
    case ParamType::kF32:
      break;
  }
  return ParamCopyType::kNone;
}

void round_master(const float* master, ParamType type, void* dst, uint64_t count) {
  if (type == ParamType::kF32) {
    std::memcpy(dst, master, count * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  for (uint64_t i = 0; i < count; ++i) {
    out[i] = type == ParamType::kF16 ? adam_detail::float_to_half(master[i])
                                     : adam_detail::float_to_bf16(master[i]);
  }
}

void widen_param(const void* src, ParamType type, float* dst, uint64_t count) {
  if (type == ParamType::kF32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  for (uint64_t i = 0; i < count; ++i) {
    dst[i] = type == ParamType::kF16 ? adam_detail::half_to_float(in[i])
                                     : adam_detail::bf16_to_float(in[i]);
  }
}

void Completion::signal(absl::Status status) {
  MutexLock lock(&mu_);
  done_ = true;
  status_ = std::move(status);
}

absl::Status Completion::wait() {
  MutexLock lock(&mu_);
  tsan_release(&mu_);
  mu_.Await(absl::Condition(&done_));
  tsan_acquire(&mu_);
  return status_;
}

bool Completion::pending() const {
  MutexLock lock(&mu_);
  return !done_;
}

absl::Status OffloadOptimizer::Impl::adam_piece(const Param& p, const AdamGroup& group,
                                                uint64_t step, float grad_scale, const Piece& piece,
                                                const std::byte* grad, float* master,
                                                float* exp_avg, float* exp_avg_sq, void* copy,
                                                std::span<float* const> backup) const {
  AdamTensors t;
  if (backup.size() == 3) {
    t.backup_master = backup[0];
    t.backup_exp_avg = backup[1];
    t.backup_exp_avg_sq = backup[2];
  }
  t.master = master;
  t.exp_avg = exp_avg;
  t.exp_avg_sq = exp_avg_sq;
  t.grad = grad + piece.offset * element_bytes(p.grad_type);
  t.grad_type = p.grad_type;
  t.param_copy = copy;
  t.copy_type = copy_type(p.param_type);
  t.count = piece.count;
  AdamParams a;
  static_cast<AdamHyper&>(a) = group;
  a.step = step;
  a.grad_scale = grad_scale;
  auto result = adam_step_with(options.isa, t, a, adam_pool.get());
  return result.ok() ? absl::OkStatus() : result.status();
}

float OffloadOptimizer::Impl::unclipped_grad_scale(float scale) const {
  // step() computes clip_coef / divisor in double and rounds once; clip_coef is then 1.
  const double divisor = static_cast<double>(scale) * options.grad_divisor;
  return static_cast<float>(1.0 / divisor);
}

}  // namespace strata
