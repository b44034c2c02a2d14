// strata CPU Adam / AdamW — the optimizer step of ZeRO-Offload, run on the host.
//
// adam_step() makes one fused pass per element: it reads the gradient (fp32, fp16 or bf16),
// updates the fp32 master weight and both moments, writes the low-precision parameter copy
// (fp16 or bf16, round-to-nearest-even) and accumulates the gradient's sum of squares and an
// inf/nan flag. One pass matters because the step is memory-bound: every extra sweep over the
// optimizer state costs as much as the step itself.
//
// The semantics follow torch.optim.Adam (decoupled=false, L2 weight decay added to the gradient)
// and torch.optim.AdamW (decoupled=true, p *= 1 - lr*wd before the Adam update).
//
// Overflow handling: adam_step() updates the state even when the gradient holds inf/nan (it
// reports it in AdamResult::non_finite). A caller that must skip an overflowed step without
// touching the state calls grad_stats() first (one read-only pass over the gradient) and only
// then adam_step().
//
// The kernels are SIMD with run-time dispatch (AVX-512, AVX2+F16C+FMA, scalar). They run on a
// CpuPool when one is given (cpu_pool.h: CPUs next to the states, cores left to the data loader,
// threads pinned; the offload optimizer passes its own), else over every allowed core in one
// persistent, unpinned oneTBB arena. The sum of squares is combined per fixed-size chunk in
// index order, so it is bit-identical from run to run on the same ISA whatever the thread count
// or placement.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace strata {

class CpuPool;  // cpu_pool.h

enum class GradType { kF32, kF16, kBF16 };
enum class ParamCopyType { kNone, kF16, kBF16 };

// Instruction-set variants of the kernels. kAuto picks the best one the CPU supports.
enum class CpuIsa { kAuto, kScalar, kAvx2, kAvx512 };

// Adam / AdamW hyper-parameters: the one struct that the kernels (through AdamParams), the
// optimizer's parameter groups (AdamGroup, offload_optimizer.h) and offload-bench's naive
// baseline use. The defaults are torch.optim.AdamW's (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
// decoupled weight decay) except weight_decay, which is 0 here (torch.optim.AdamW: 0.01): a
// group decays only when asked to, as strata's optimizer, its C API and its Python module
// always have.
struct AdamHyper {
  float lr = 1e-3F;
  float beta1 = 0.9F;
  float beta2 = 0.999F;
  float eps = 1e-8F;
  float weight_decay = 0.0F;
  bool decoupled = true;  // AdamW (p *= 1 - lr*wd); false: Adam with L2 decay added to the grad
  friend bool operator==(const AdamHyper&, const AdamHyper&) = default;
};

// OK, or InvalidArgument naming the first bad field and its value ("beta1 1.5 must be in
// [0, 1)"); callers prefix their own name.
absl::Status validate_adam(const AdamHyper& hyper);

// One kernel call: the hyper-parameters, and this step's number and gradient scale.
struct AdamParams : AdamHyper {
  uint64_t step = 1;        // 1-based, for bias correction
  float grad_scale = 1.0F;  // gradients are multiplied by this first (loss unscale, clipping)
};

struct AdamTensors {
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  GradType grad_type = GradType::kF32;
  void* param_copy = nullptr;  // fp16/bf16 copy of the updated master; unused with kNone
  ParamCopyType copy_type = ParamCopyType::kNone;
  uint64_t count = 0;
  // Optional (all three or none): the states as they were before this step are copied here,
  // chunk by chunk just before the chunk is stepped (while its bytes are in cache), so that the
  // step can be undone exactly (the optimizer's overlapped step).
  float* backup_master = nullptr;
  float* backup_exp_avg = nullptr;
  float* backup_exp_avg_sq = nullptr;
};

struct AdamResult {
  double grad_sq_sum = 0.0;  // sum of squares of the scaled gradient (before weight decay)
  bool non_finite = false;   // some scaled gradient element is inf or nan
};

// One Adam/AdamW step over `t.count` elements. InvalidArgument (naming the field) for a null
// pointer with count > 0 or a bad hyper-parameter.
absl::StatusOr<AdamResult> adam_step(const AdamTensors& t, const AdamParams& p);

// Sum of squares and inf/nan flag of grad * grad_scale, without touching any optimizer state.
absl::StatusOr<AdamResult> grad_stats(const void* grad, GradType type, uint64_t count,
                                      float grad_scale);

// dst += src element-wise, in `type` (fp32 arithmetic, the sum rounded to nearest even), with
// the sum of squares and inf/nan flag of the new dst: gradient accumulation over micro-steps.
absl::StatusOr<AdamResult> grad_accumulate(void* dst, const void* src, GradType type,
                                           uint64_t count);

// The same with a forced ISA (kAuto: the best) and, unless null, on `pool`. FailedPrecondition
// if the CPU (or the OS) does not support `isa`. A pool's first run places it next to the
// memory it touches: the master weights for adam_step, else the gradient / destination.
absl::StatusOr<AdamResult> adam_step_with(CpuIsa isa, const AdamTensors& t, const AdamParams& p,
                                          CpuPool* pool = nullptr);
absl::StatusOr<AdamResult> grad_stats_with(CpuIsa isa, const void* grad, GradType type,
                                           uint64_t count, float grad_scale,
                                           CpuPool* pool = nullptr);
absl::StatusOr<AdamResult> grad_accumulate_with(CpuIsa isa, void* dst, const void* src,
                                                GradType type, uint64_t count,
                                                CpuPool* pool = nullptr);

// "avx512", "avx2" or "scalar": what kAuto resolves to on this CPU.
std::string_view adam_isa();
std::string_view isa_name(CpuIsa isa);
// Every ISA this CPU can run, scalar first.
std::vector<CpuIsa> supported_isas();

}  // namespace strata
