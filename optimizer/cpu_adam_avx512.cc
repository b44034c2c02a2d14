// AVX-512 CPU Adam kernel, 16 floats per vector. Compiled with -mavx512f/bw/dq/vl -mfma -mf16c
// (offload/CMakeLists.txt) and only called after the driver has checked the CPU supports them.
// bf16 is converted by hand rather than with avx512_bf16's vcvtneps2bf16, which flushes
// denormals to zero and so is not the round-to-nearest-even conversion the copy must be.
#include <immintrin.h>

#include "cpu_adam_kernels.h"
#include "cpu_adam_simd.h"

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

// The vector operations simd_step and simd_stats (cpu_adam_simd.h) are written over.
struct Avx512 {
  using F = __m512;
  struct Acc {
    __m512d lo = _mm512_setzero_pd();
    __m512d hi = _mm512_setzero_pd();
  };
  static constexpr uint64_t kWidth = kAvx512Width;
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* src) { return _mm512_loadu_ps(src); }
  static void store(float* dst, F x) { _mm512_storeu_ps(dst, x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  template <GradType G>
  static F grad(const void* src, uint64_t i) {
    return load_grad<G>(src, i);
  }
  template <ParamCopyType C>
  static void copy(void* dst, uint64_t i, F value) {
    store_copy<C>(dst, i, value);
  }
  static void add_sq(F g, Acc& acc) { accumulate_sq(g, acc.lo, acc.hi); }
  static double sum(const Acc& acc) { return hsum(acc.lo, acc.hi); }
};

}  // namespace

ChunkResult step_avx512(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  return simd_step<Avx512>(t, begin, end, s);
}

ChunkResult stats_avx512(const void* grad, GradType type, uint64_t begin, uint64_t end,
                         float scale) {
  return simd_stats<Avx512>(grad, type, begin, end, scale);
}

ChunkResult accumulate_avx512(void* dst, const void* src, GradType type, uint64_t begin,
                              uint64_t end) {
  return simd_accumulate<Avx512>(dst, src, type, begin, end);
}

}  // namespace strata::adam_detail
