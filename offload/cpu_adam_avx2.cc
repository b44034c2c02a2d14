// AVX2 + FMA + F16C CPU Adam kernel, 8 floats per vector. Compiled with -mavx2 -mfma -mf16c
// (offload/CMakeLists.txt) and only called after the driver has checked the CPU supports them.
#include <immintrin.h>

#include "cpu_adam_kernels.h"

namespace strata::adam_detail {
namespace {

template <GradType G>
__m256 load_grad(const void* grad, uint64_t i) {
  if constexpr (G == GradType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
    if constexpr (G == GradType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {
      // bf16 is the top half of an fp32.
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

template <ParamCopyType C>
void store_copy(void* copy, uint64_t i, __m256 p) {
  if constexpr (C == ParamCopyType::kNone) {
    return;
  } else {
    auto* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(copy) + i);
    if constexpr (C == ParamCopyType::kF16) {
      _mm_storeu_si128(dst, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT));
    } else {
      // Round to nearest even on the 16 dropped bits; a NaN becomes a quiet NaN instead, since
      // the rounding add could carry a NaN payload into inf.
      const __m256i x = _mm256_castps_si256(p);
      const __m256i hi = _mm256_srli_epi32(x, 16);
      const __m256i bias =
          _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
      const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
      const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
      const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
      const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
      _mm_storeu_si128(dst,
                       _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
    }
  }
}

// Squares are accumulated in double so that a chunk's sum is as accurate as the reference.
inline void accumulate_sq(__m256 g, __m256d& acc0, __m256d& acc1) {
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(g));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(g, 1));
  acc0 = _mm256_fmadd_pd(lo, lo, acc0);
  acc1 = _mm256_fmadd_pd(hi, hi, acc1);
}

inline double hsum(__m256d a, __m256d b) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a, b));
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

template <GradType G, ParamCopyType C>
ChunkResult step(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  const __m256 beta1 = _mm256_set1_ps(s.beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2);
  const __m256 omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(s.eps);
  const __m256 wd = _mm256_set1_ps(s.weight_decay);
  const __m256 decay = _mm256_set1_ps(s.decay);
  const __m256 step_size = _mm256_set1_ps(s.step_size);
  const __m256 inv_sqrt_bc2 = _mm256_set1_ps(s.inv_sqrt_bc2);
  const __m256 scale = _mm256_set1_ps(s.grad_scale);
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  for (uint64_t i = begin; i < end; i += kAvx2Width) {
    __m256 g = _mm256_mul_ps(load_grad<G>(t.grad, i), scale);
    accumulate_sq(g, acc0, acc1);
    __m256 p = _mm256_loadu_ps(t.master + i);
    g = _mm256_fmadd_ps(wd, p, g);
    p = _mm256_mul_ps(p, decay);
    const __m256 m = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(t.exp_avg + i), _mm256_mul_ps(omb1, g));
    const __m256 v = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(t.exp_avg_sq + i),
                                     _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), inv_sqrt_bc2, eps);
    p = _mm256_fnmadd_ps(step_size, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(t.exp_avg + i, m);
    _mm256_storeu_ps(t.exp_avg_sq + i, v);
    _mm256_storeu_ps(t.master + i, p);
    store_copy<C>(t.param_copy, i, p);
  }
  return {hsum(acc0, acc1)};
}

template <GradType G>
ChunkResult step_copy(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  switch (t.copy_type) {
    case ParamCopyType::kF16:
      return step<G, ParamCopyType::kF16>(t, begin, end, s);
    case ParamCopyType::kBF16:
      return step<G, ParamCopyType::kBF16>(t, begin, end, s);
    case ParamCopyType::kNone:
      break;
  }
  return step<G, ParamCopyType::kNone>(t, begin, end, s);
}

template <GradType G>
ChunkResult stats(const void* grad, uint64_t begin, uint64_t end, float scale) {
  const __m256 vscale = _mm256_set1_ps(scale);
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  for (uint64_t i = begin; i < end; i += kAvx2Width) {
    accumulate_sq(_mm256_mul_ps(load_grad<G>(grad, i), vscale), acc0, acc1);
  }
  return {hsum(acc0, acc1)};
}

}  // namespace

ChunkResult step_avx2(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  switch (t.grad_type) {
    case GradType::kF16:
      return step_copy<GradType::kF16>(t, begin, end, s);
    case GradType::kBF16:
      return step_copy<GradType::kBF16>(t, begin, end, s);
    case GradType::kF32:
      break;
  }
  return step_copy<GradType::kF32>(t, begin, end, s);
}

ChunkResult stats_avx2(const void* grad, GradType type, uint64_t begin, uint64_t end, float scale) {
  switch (type) {
    case GradType::kF16:
      return stats<GradType::kF16>(grad, begin, end, scale);
    case GradType::kBF16:
      return stats<GradType::kBF16>(grad, begin, end, scale);
    case GradType::kF32:
      break;
  }
  return stats<GradType::kF32>(grad, begin, end, scale);
}

}  // namespace strata::adam_detail
