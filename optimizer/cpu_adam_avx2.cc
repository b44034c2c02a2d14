// AVX2 + FMA + F16C CPU Adam kernel, 8 floats per vector. Compiled with -mavx2 -mfma -mf16c
// (offload/CMakeLists.txt) and only called after the driver has checked the CPU supports them.
#include <immintrin.h>

#include "cpu_adam_kernels.h"
#include "cpu_adam_simd.h"

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

// The vector operations simd_step and simd_stats (cpu_adam_simd.h) are written over.
struct Avx2 {
  using F = __m256;
  struct Acc {
    __m256d lo = _mm256_setzero_pd();
    __m256d hi = _mm256_setzero_pd();
  };
  static constexpr uint64_t kWidth = kAvx2Width;
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* src) { return _mm256_loadu_ps(src); }
  static void store(float* dst, F x) { _mm256_storeu_ps(dst, x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
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

ChunkResult step_avx2(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  return simd_step<Avx2>(t, begin, end, s);
}

ChunkResult stats_avx2(const void* grad, GradType type, uint64_t begin, uint64_t end, float scale) {
  return simd_stats<Avx2>(grad, type, begin, end, scale);
}

ChunkResult accumulate_avx2(void* dst, const void* src, GradType type, uint64_t begin,
                            uint64_t end) {
  return simd_accumulate<Avx2>(dst, src, type, begin, end);
}

}  // namespace strata::adam_detail
