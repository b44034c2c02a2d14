// Scalar CPU Adam kernel: the fallback on CPUs without AVX2 and the tail of the SIMD kernels.
// Compiled without any -m flag so that it runs everywhere.
#include <cmath>
#include <cstring>

#include "cpu_adam_kernels.h"

namespace strata::adam_detail {
namespace {

uint32_t bits_of(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

float load_grad(const void* grad, GradType type, uint64_t i) {
  switch (type) {
    case GradType::kF16:
      return half_to_float(static_cast<const uint16_t*>(grad)[i]);
    case GradType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(grad)[i]);
    case GradType::kF32:
      break;
  }
  return static_cast<const float*>(grad)[i];
}

void store_copy(void* copy, ParamCopyType type, uint64_t i, float p) {
  switch (type) {
    case ParamCopyType::kF16:
      static_cast<uint16_t*>(copy)[i] = float_to_half(p);
      break;
    case ParamCopyType::kBF16:
      static_cast<uint16_t*>(copy)[i] = float_to_bf16(p);
      break;
    case ParamCopyType::kNone:
      break;
  }
}

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000U) << 16;
  const uint32_t exp = (h >> 10) & 0x1FU;
  const uint32_t mant = h & 0x3FFU;
  if (exp == 0x1F) return float_of(sign | 0x7F800000U | (mant << 13));
  if (exp == 0) {
    // Subnormal (or zero): mant * 2^-24 is exact in float.
    const float mag = static_cast<float>(mant) * 0x1p-24F;
    return sign != 0 ? -mag : mag;
  }
  return float_of(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000U;
  const uint32_t ax = x & 0x7FFFFFFFU;
  uint32_t out = 0;
  if (ax > 0x7F800000U) {
    out = sign | 0x7E00U | ((ax >> 13) & 0x3FFU);  // quiet NaN, top payload bits kept
  } else if (ax >= 0x477FF000U) {
    out = sign | 0x7C00U;  // >= 65520 rounds (ties to even) to inf; inf stays inf
  } else if (ax >= 0x38800000U) {
    // Normal half: round the 13 dropped mantissa bits to nearest even; a carry into the
    // exponent is the correct result. Then rebias the exponent from 127 to 15.
    const uint32_t r = ax + 0xFFFU + ((ax >> 13) & 1U);
    out = sign | ((r - 0x38000000U) >> 13);
  } else {
    // Subnormal half (unit 2^-24): adding 0.5 puts the unit in the last place of the float, so
    // the FPU's own round-to-nearest-even does the rounding; 0x400 is the smallest normal.
    const float t = float_of(ax) + 0.5F;
    out = sign | (bits_of(t) - 0x3F000000U);
  }
  return static_cast<uint16_t>(out);
}

float bf16_to_float(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bf16(float f) {
  const uint32_t x = bits_of(f);
  if ((x & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<uint16_t>((x >> 16) | 0x40U);
  // Overflow into the exponent (up to inf) is the correct rounding.
  return static_cast<uint16_t>((x + 0x7FFFU + ((x >> 16) & 1U)) >> 16);
}

ChunkResult step_scalar(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  double sq = 0.0;
  for (uint64_t i = begin; i < end; ++i) {
    float g = load_grad(t.grad, t.grad_type, i) * s.grad_scale;
    sq += static_cast<double>(g) * static_cast<double>(g);
    float p = t.master[i];
    g = g + s.weight_decay * p;
    p = p * s.decay;
    const float m = s.beta1 * t.exp_avg[i] + s.one_minus_beta1 * g;
    const float v = s.beta2 * t.exp_avg_sq[i] + s.one_minus_beta2 * g * g;
    const float denom = std::sqrt(v) * s.inv_sqrt_bc2 + s.eps;
    p = p - s.step_size * m / denom;
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    t.master[i] = p;
    store_copy(t.param_copy, t.copy_type, i, p);
  }
  return {sq};
}

ChunkResult stats_scalar(const void* grad, GradType type, uint64_t begin, uint64_t end,
                         float scale) {
  double sq = 0.0;
  for (uint64_t i = begin; i < end; ++i) {
    const double g = static_cast<double>(load_grad(grad, type, i) * scale);
    sq += g * g;
  }
  return {sq};
}

ChunkResult accumulate_scalar(void* dst, const void* src, GradType type, uint64_t begin,
                              uint64_t end) {
  double sq = 0.0;
  for (uint64_t i = begin; i < end; ++i) {
    const float sum = load_grad(dst, type, i) + load_grad(src, type, i);
    if (type == GradType::kF32) {
      static_cast<float*>(dst)[i] = sum;
    } else {
      store_copy(dst, type == GradType::kF16 ? ParamCopyType::kF16 : ParamCopyType::kBF16, i, sum);
    }
    const double stored = load_grad(dst, type, i);
    sq += stored * stored;
  }
  return {sq};
}

}  // namespace strata::adam_detail
