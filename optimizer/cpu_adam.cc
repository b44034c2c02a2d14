// CPU Adam driver: validation, ISA dispatch and the parallel split over fixed-size chunks.
#include "strata/optimizer/cpu_adam.h"

#include <absl/status/status.h>
#include <absl/strings/str_cat.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cpu_adam_kernels.h"
#include "strata/optimizer/cpu_pool.h"

namespace strata {
namespace {

using adam_detail::ChunkResult;

// Elements per chunk: 16 Ki fp32 masters are 64 KiB, and with m, v, grad and copy a chunk
// touches ~480 KiB, which stays within a core's L2 while it is being streamed. The chunk size is
// fixed (not derived from the thread count) so that the per-chunk sums, combined in index order,
// give the same total on every run. It is a multiple of every SIMD width, so only the last
// chunk has a scalar tail.
constexpr uint64_t kChunk = 16 * 1024;
static_assert(kChunk % adam_detail::kAvx512Width == 0);

bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

bool isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return cpu_has_avx512();
    case CpuIsa::kAvx2:
      return cpu_has_avx2();
    case CpuIsa::kScalar:
    case CpuIsa::kAuto:
      return true;
  }
  return false;
}

CpuIsa best_isa() {
  // Resolved once: the CPU does not change under a running process.
  static const CpuIsa isa = cpu_has_avx512() ? CpuIsa::kAvx512
                            : cpu_has_avx2() ? CpuIsa::kAvx2
                                             : CpuIsa::kScalar;
  return isa;
}

// One arena for the life of the process, so that a step does not pay for creating and tearing
// down worker threads; its concurrency is all cores, the default of task_arena.
[[maybe_unused]] tbb::task_arena& arena() {
  static tbb::task_arena a;
  return a;
}

uint64_t simd_width(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return adam_detail::kAvx512Width;
    case CpuIsa::kAvx2:
      return adam_detail::kAvx2Width;
    case CpuIsa::kScalar:
    case CpuIsa::kAuto:
      break;
  }
  return 1;
}

// Runs chunk(begin, end) over [0, count) split into kChunk pieces and sums the results in chunk
// order. A single chunk runs on the calling thread: small tensors are not worth a hand-off.
// With a pool the chunks run on its threads (`near` places it on its first run).
template <typename ChunkFn>
AdamResult run_chunks(uint64_t count, CpuPool* pool, const void* near, const ChunkFn& chunk) {
  const uint64_t n_chunks = (count + kChunk - 1) / kChunk;
  std::vector<double> partial(n_chunks, 0.0);
  auto body = [&](uint64_t c) {
    const uint64_t begin = c * kChunk;
    const uint64_t end = begin + kChunk < count ? begin + kChunk : count;
    partial[c] = chunk(begin, end).sq_sum;
  };
  if (n_chunks <= 1) {
    for (uint64_t c = 0; c < n_chunks; ++c) body(c);
  } else if (pool != nullptr) {
    pool->parallel_for(n_chunks, body, near);
  } else {
#if defined(STRATA_TSAN)
    // Debian's oneTBB is not built with ThreadSanitizer: TSan sees its inlined headers race with
    // its library. The TSan build runs the same chunks on plain threads instead, so the kernels
    // themselves are still checked for races.
    const uint64_t threads = std::max<uint64_t>(2, std::thread::hardware_concurrency());
    std::vector<std::thread> workers;
    for (uint64_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (uint64_t c = t; c < n_chunks; c += threads) body(c);
      });
    }
    for (auto& worker : workers) worker.join();
#else
    // static_partitioner gives each thread the same contiguous run of chunks on every call, so
    // a thread keeps touching the pages it touched first (NUMA first-touch locality).
    arena().execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<uint64_t>(0, n_chunks),
          [&](const tbb::blocked_range<uint64_t>& r) {
            for (uint64_t c = r.begin(); c != r.end(); ++c) body(c);
          },
          tbb::static_partitioner());
    });
#endif
  }
  double sum = 0.0;
  for (double p : partial) sum += p;
  // Squares of finite floats cannot overflow a double, so the sum is finite exactly when every
  // scaled gradient element is: the inf/nan check costs nothing in the element loop.
  return {sum, !std::isfinite(sum)};
}

bool finite(float x) { return std::isfinite(x); }

absl::Status invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("adam_step: ", std::string(field), " ", std::string(why)));
}

absl::Status validate(const AdamTensors& t, const AdamParams& p) {
  if (absl::Status st = validate_adam(p); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("adam_step: ", st.message()));
  }
  if (!finite(p.grad_scale)) return invalid("grad_scale", "must be finite");
  if (p.step == 0) return invalid("step", "is 1-based and must be >= 1");
  if (t.grad_type != GradType::kF32 && t.grad_type != GradType::kF16 &&
      t.grad_type != GradType::kBF16) {
    return invalid("grad_type", "is not a GradType");
  }
  if (t.copy_type != ParamCopyType::kNone && t.copy_type != ParamCopyType::kF16 &&
      t.copy_type != ParamCopyType::kBF16) {
    return invalid("copy_type", "is not a ParamCopyType");
  }
  if (t.count == 0) return absl::OkStatus();
  if (t.master == nullptr) return invalid("master", "is null");
  if (t.exp_avg == nullptr) return invalid("exp_avg", "is null");
  if (t.exp_avg_sq == nullptr) return invalid("exp_avg_sq", "is null");
  const int backups = (t.backup_master != nullptr) + (t.backup_exp_avg != nullptr) +
                      (t.backup_exp_avg_sq != nullptr);
  if (backups != 0 && backups != 3) {
    return invalid("backup_master/backup_exp_avg/backup_exp_avg_sq", "must be all set or none");
  }
  if (t.grad == nullptr) return invalid("grad", "is null");
  if (t.copy_type != ParamCopyType::kNone && t.param_copy == nullptr) {
    return invalid("param_copy", "is null");
  }
  return absl::OkStatus();
}

adam_detail::StepScalars scalars(const AdamParams& p) {
  // Bias corrections in double: beta2^t for t in the millions is still representable there.
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  adam_detail::StepScalars s{};
  s.beta1 = p.beta1;
  s.beta2 = p.beta2;
  s.one_minus_beta1 = 1.0F - p.beta1;
  s.one_minus_beta2 = 1.0F - p.beta2;
  s.eps = p.eps;
  s.weight_decay = p.decoupled ? 0.0F : p.weight_decay;
  s.decay = p.decoupled ? 1.0F - p.lr * p.weight_decay : 1.0F;
  s.step_size = static_cast<float>(static_cast<double>(p.lr) / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.grad_scale = p.grad_scale;
  return s;
}

absl::StatusOr<CpuIsa> resolve(CpuIsa isa) {
  if (isa == CpuIsa::kAuto) return best_isa();
  if (!isa_supported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("CPU Adam: this CPU does not support ", std::string(isa_name(isa))));
  }
  return isa;
}

// The elements after the last whole vector of a range. With a SIMD kernel they go through the
// same kernel on a zero-padded copy, so that every element is computed by the same instructions
// (fused multiply-adds included) wherever it lies: a parameter's result does not depend on how
// it is cut into pieces (ZeRO's partitions must equal one rank's step bit for bit).
adam_detail::ChunkResult step_tail(CpuIsa use, const AdamTensors& t, uint64_t begin, uint64_t end,
                                   const adam_detail::StepScalars& s) {
  if (use == CpuIsa::kScalar || begin == end) return adam_detail::step_scalar(t, begin, end, s);
  constexpr uint64_t kMax = adam_detail::kAvx512Width;
  const uint64_t n = end - begin;
  const uint64_t grad_bytes = t.grad_type == GradType::kF32 ? 4 : 2;
  const uint64_t copy_bytes = 2;
  float master[kMax] = {}, exp_avg[kMax] = {}, exp_avg_sq[kMax] = {};
  alignas(64) std::byte grad[kMax * 4] = {};
  alignas(64) std::byte copy[kMax * 2] = {};
  std::copy_n(t.master + begin, n, master);
  std::copy_n(t.exp_avg + begin, n, exp_avg);
  std::copy_n(t.exp_avg_sq + begin, n, exp_avg_sq);
  std::memcpy(grad, static_cast<const std::byte*>(t.grad) + begin * grad_bytes, n * grad_bytes);
  AdamTensors padded = t;
  padded.master = master;
  padded.exp_avg = exp_avg;
  padded.exp_avg_sq = exp_avg_sq;
  padded.grad = grad;
  padded.param_copy = t.copy_type == ParamCopyType::kNone ? nullptr : copy;
  const uint64_t width = use == CpuIsa::kAvx512 ? kMax : adam_detail::kAvx2Width;
  padded.count = width;
  // Padding is zero everywhere: its gradient adds nothing to the sum of squares.
  const adam_detail::ChunkResult r = use == CpuIsa::kAvx512
                                         ? adam_detail::step_avx512(padded, 0, width, s)
                                         : adam_detail::step_avx2(padded, 0, width, s);
  std::copy_n(master, n, t.master + begin);
  std::copy_n(exp_avg, n, t.exp_avg + begin);
  std::copy_n(exp_avg_sq, n, t.exp_avg_sq + begin);
  if (t.copy_type != ParamCopyType::kNone) {
    std::memcpy(static_cast<std::byte*>(t.param_copy) + begin * copy_bytes, copy, n * copy_bytes);
  }
  return r;
}

}  // namespace

absl::Status validate_adam(const AdamHyper& h) {
  const auto bad = [](std::string_view field, float value, std::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), " ", value, " ", std::string(rule)));
  };
  if (!finite(h.lr) || h.lr < 0) return bad("lr", h.lr, "must be finite and >= 0");
  if (!(h.beta1 >= 0 && h.beta1 < 1)) return bad("beta1", h.beta1, "must be in [0, 1)");
  if (!(h.beta2 >= 0 && h.beta2 < 1)) return bad("beta2", h.beta2, "must be in [0, 1)");
  if (!finite(h.eps) || h.eps <= 0) return bad("eps", h.eps, "must be finite and > 0");
  if (!finite(h.weight_decay) || h.weight_decay < 0) {
    return bad("weight_decay", h.weight_decay, "must be finite and >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<AdamResult> adam_step_with(CpuIsa isa, const AdamTensors& t, const AdamParams& p,
                                          CpuPool* pool) {
  absl::StatusOr<CpuIsa> resolved = resolve(isa);
  if (!resolved.ok()) return resolved.status();
  if (absl::Status st = validate(t, p); !st.ok()) return st;
  const adam_detail::StepScalars s = scalars(p);
  const uint64_t width = simd_width(*resolved);
  const CpuIsa use = *resolved;
  const bool backup = t.backup_master != nullptr;
  return run_chunks(t.count, pool, t.master, [&](uint64_t begin, uint64_t end) {
    if (backup) {
      const uint64_t bytes = (end - begin) * sizeof(float);
      std::memcpy(t.backup_master + begin, t.master + begin, bytes);
      std::memcpy(t.backup_exp_avg + begin, t.exp_avg + begin, bytes);
      std::memcpy(t.backup_exp_avg_sq + begin, t.exp_avg_sq + begin, bytes);
    }
    const uint64_t vec_end = begin + (end - begin) / width * width;
    ChunkResult r{};
    if (use == CpuIsa::kAvx512) r = adam_detail::step_avx512(t, begin, vec_end, s);
    if (use == CpuIsa::kAvx2) r = adam_detail::step_avx2(t, begin, vec_end, s);
    if (use == CpuIsa::kScalar) r = adam_detail::step_scalar(t, begin, vec_end, s);
    r.sq_sum += step_tail(use, t, vec_end, end, s).sq_sum;
    return r;
  });
}

absl::StatusOr<AdamResult> grad_stats_with(CpuIsa isa, const void* grad, GradType type,
                                           uint64_t count, float grad_scale, CpuPool* pool) {
  absl::StatusOr<CpuIsa> resolved = resolve(isa);
  if (!resolved.ok()) return resolved.status();
  if (type != GradType::kF32 && type != GradType::kF16 && type != GradType::kBF16) {
    return invalid("grad_type", "is not a GradType");
  }
  if (!finite(grad_scale)) return invalid("grad_scale", "must be finite");
  if (count > 0 && grad == nullptr) return invalid("grad", "is null");
  const uint64_t width = simd_width(*resolved);
  const CpuIsa use = *resolved;
  return run_chunks(count, pool, grad, [&](uint64_t begin, uint64_t end) {
    const uint64_t vec_end = begin + (end - begin) / width * width;
    ChunkResult r{};
    if (use == CpuIsa::kAvx512)
      r = adam_detail::stats_avx512(grad, type, begin, vec_end, grad_scale);
    if (use == CpuIsa::kAvx2) r = adam_detail::stats_avx2(grad, type, begin, vec_end, grad_scale);
    if (use == CpuIsa::kScalar)
      r = adam_detail::stats_scalar(grad, type, begin, vec_end, grad_scale);
    r.sq_sum += adam_detail::stats_scalar(grad, type, vec_end, end, grad_scale).sq_sum;
    return r;
  });
}

absl::StatusOr<AdamResult> grad_accumulate_with(CpuIsa isa, void* dst, const void* src,
                                                GradType type, uint64_t count, CpuPool* pool) {
  absl::StatusOr<CpuIsa> resolved = resolve(isa);
  if (!resolved.ok()) return resolved.status();
  if (type != GradType::kF32 && type != GradType::kF16 && type != GradType::kBF16) {
    return invalid("grad_type", "is not a GradType");
  }
  if (count > 0 && dst == nullptr) return invalid("dst", "is null");
  if (count > 0 && src == nullptr) return invalid("src", "is null");
  const uint64_t width = simd_width(*resolved);
  const CpuIsa use = *resolved;
  return run_chunks(count, pool, dst, [&](uint64_t begin, uint64_t end) {
    const uint64_t vec_end = begin + (end - begin) / width * width;
    ChunkResult r{};
    if (use == CpuIsa::kAvx512) r = adam_detail::accumulate_avx512(dst, src, type, begin, vec_end);
    if (use == CpuIsa::kAvx2) r = adam_detail::accumulate_avx2(dst, src, type, begin, vec_end);
    if (use == CpuIsa::kScalar) r = adam_detail::accumulate_scalar(dst, src, type, begin, vec_end);
    r.sq_sum += adam_detail::accumulate_scalar(dst, src, type, vec_end, end).sq_sum;
    return r;
  });
}

absl::StatusOr<AdamResult> grad_accumulate(void* dst, const void* src, GradType type,
                                           uint64_t count) {
  return grad_accumulate_with(CpuIsa::kAuto, dst, src, type, count);
}

absl::StatusOr<AdamResult> adam_step(const AdamTensors& t, const AdamParams& p) {
  return adam_step_with(CpuIsa::kAuto, t, p);
}

absl::StatusOr<AdamResult> grad_stats(const void* grad, GradType type, uint64_t count,
                                      float grad_scale) {
  return grad_stats_with(CpuIsa::kAuto, grad, type, count, grad_scale);
}

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAuto:
      break;
  }
  return "auto";
}

std::string_view adam_isa() { return isa_name(best_isa()); }

std::vector<CpuIsa> supported_isas() {
  std::vector<CpuIsa> out{CpuIsa::kScalar};
  if (cpu_has_avx2()) out.push_back(CpuIsa::kAvx2);
  if (cpu_has_avx512()) out.push_back(CpuIsa::kAvx512);
  return out;
}

}  // namespace strata
