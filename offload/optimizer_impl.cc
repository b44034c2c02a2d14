// The small helpers optimizer_impl.h declares for every file of the optimizer: element sizes,
// the fp16/bf16 conversions of master weights and parameters, and Completion.
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

}  // namespace strata
