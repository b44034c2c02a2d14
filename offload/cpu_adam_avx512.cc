// AVX-512 CPU Adam kernel, 16 floats per vector. Compiled with -mavx512f/bw/dq/vl -mfma -mf16c
// (offload/CMakeLists.txt) and only called after the driver has checked the CPU supports them.
// bf16 is converted by hand rather than with avx512_bf16's vcvtneps2bf16, which flushes
// denormals to zero and so is not the round-to-nearest-even conversion the copy must be.
#include <immintrin.h>

#include "cpu_adam_kernels.h"

namespace strata::adam_detail {
namespace {

template <GradType G>
__m512 load_grad(const void* grad, uint64_t i) {
  if constexpr (G == GradType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(grad) + i));
    if constexpr (G == GradType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      // bf16 is the top half of an fp32.
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <ParamCopyType C>
void store_copy(void* copy, uint64_t i, __m512 p) {
  if constexpr (C == ParamCopyType::kNone) {
    return;
  } else {
    auto* dst = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(copy) + i);
    if constexpr (C == ParamCopyType::kF16) {
      _mm256_storeu_si256(dst, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      // Round to nearest even on the 16 dropped bits; a NaN becomes a quiet NaN instead, since
      // the rounding add could carry a NaN payload into inf.
      const __m512i x = _mm512_castps_si512(p);
      const __m512i hi = _mm512_srli_epi32(x, 16);
      const __m512i bias =
          _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(hi, _mm512_set1_epi32(1)));
      const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
      const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
      const __mmask16 nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
      _mm256_storeu_si256(dst, _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
    }
  }
}

// Squares are accumulated in double so that a chunk's sum is as accurate as the reference.
inline void accumulate_sq(__m512 g, __m512d& acc0, __m512d& acc1) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(g));
  const __m512d hi =
      _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(g), 1)));
  acc0 = _mm512_fmadd_pd(lo, lo, acc0);
  acc1 = _mm512_fmadd_pd(hi, hi, acc1);
}

inline double hsum(__m512d a, __m512d b) {
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, _mm512_add_pd(a, b));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

template <GradType G, ParamCopyType C>
ChunkResult step(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  const __m512 beta1 = _mm512_set1_ps(s.beta1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2);
  const __m512 omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(s.eps);
  const __m512 wd = _mm512_set1_ps(s.weight_decay);
  const __m512 decay = _mm512_set1_ps(s.decay);
  const __m512 step_size = _mm512_set1_ps(s.step_size);
  const __m512 inv_sqrt_bc2 = _mm512_set1_ps(s.inv_sqrt_bc2);
  const __m512 scale = _mm512_set1_ps(s.grad_scale);
  __m512d acc0 = _mm512_setzero_pd();
  __m512d acc1 = _mm512_setzero_pd();
  for (uint64_t i = begin; i < end; i += kAvx512Width) {
    __m512 g = _mm512_mul_ps(load_grad<G>(t.grad, i), scale);
    accumulate_sq(g, acc0, acc1);
    __m512 p = _mm512_loadu_ps(t.master + i);
    g = _mm512_fmadd_ps(wd, p, g);
    p = _mm512_mul_ps(p, decay);
    const __m512 m = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(t.exp_avg + i), _mm512_mul_ps(omb1, g));
    const __m512 v = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(t.exp_avg_sq + i),
                                     _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), inv_sqrt_bc2, eps);
    p = _mm512_fnmadd_ps(step_size, _mm512_div_ps(m, denom), p);
    _mm512_storeu_ps(t.exp_avg + i, m);
    _mm512_storeu_ps(t.exp_avg_sq + i, v);
    _mm512_storeu_ps(t.master + i, p);
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
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512d acc0 = _mm512_setzero_pd();
  __m512d acc1 = _mm512_setzero_pd();
  for (uint64_t i = begin; i < end; i += kAvx512Width) {
    accumulate_sq(_mm512_mul_ps(load_grad<G>(grad, i), vscale), acc0, acc1);
  }
  return {hsum(acc0, acc1)};
}

}  // namespace

ChunkResult step_avx512(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
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

ChunkResult stats_avx512(const void* grad, GradType type, uint64_t begin, uint64_t end,
                         float scale) {
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
