// Private interface between the CPU Adam driver (cpu_adam.cc) and its per-ISA kernels.
//
// Each kernel lives in its own translation unit compiled with its own -m flags. Everything a
// kernel TU defines besides its entry points sits in an anonymous namespace: an inline function
// or template instantiated in an AVX TU and shared by name with the scalar TU could be picked by
// the linker for both and fault on a CPU without AVX.
#pragma once

#include <cstdint>

#include "strata/optimizer/cpu_adam.h"

namespace strata::adam_detail {

// Scalars derived from AdamParams once per call, so that the per-element loop has no pow/sqrt
// of hyper-parameters.
struct StepScalars {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float weight_decay;  // L2 form only (0 for AdamW)
  float decay;         // AdamW: 1 - lr*wd, applied to p before the update; 1 for L2
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float grad_scale;
};

struct ChunkResult {
  double sq_sum = 0.0;
};

// The SIMD kernels handle [begin, end) where end - begin is a multiple of their vector width;
// the driver hands the remainder to the scalar kernel.
inline constexpr uint64_t kAvx2Width = 8;
inline constexpr uint64_t kAvx512Width = 16;

ChunkResult step_scalar(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s);
ChunkResult step_avx2(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s);
ChunkResult step_avx512(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s);

ChunkResult stats_scalar(const void* grad, GradType type, uint64_t begin, uint64_t end,
                         float scale);
ChunkResult stats_avx2(const void* grad, GradType type, uint64_t begin, uint64_t end, float scale);
ChunkResult stats_avx512(const void* grad, GradType type, uint64_t begin, uint64_t end,
                         float scale);

ChunkResult accumulate_scalar(void* dst, const void* src, GradType type, uint64_t begin,
                              uint64_t end);
ChunkResult accumulate_avx2(void* dst, const void* src, GradType type, uint64_t begin,
                            uint64_t end);
ChunkResult accumulate_avx512(void* dst, const void* src, GradType type, uint64_t begin,
                              uint64_t end);

// Portable conversions (scalar TU), round-to-nearest-even, denormals and inf kept; a NaN stays a
// quiet NaN with the top of its payload, as F16C's vcvtps2ph does.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

}  // namespace strata::adam_detail
