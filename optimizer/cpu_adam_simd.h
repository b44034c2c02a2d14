// The Adam step and the gradient statistics for the SIMD kernels, written once over a vector-ops
// type V (Avx2 or Avx512 in their translation units): the formula lives in one place.
//
// V provides: F (the float vector), Acc (double accumulators for the sum of squares, value-
// initialised to zero), kWidth, set1, load, store, add, mul, div, sqrt, fmadd (a*b+c), fnmadd
// (c-a*b), grad<GradType>(ptr, i), copy<ParamCopyType>(ptr, i, F), add_sq(F, Acc&), sum(Acc).
//
// Everything here has internal linkage (unnamed namespace): each ISA translation unit, compiled
// with its own -m flags, gets its own instantiations, never shared by name (see
// cpu_adam_kernels.h). Include it only from those translation units.
#pragma once

#include "cpu_adam_kernels.h"

namespace strata::adam_detail {
namespace {

template <class V, GradType G, ParamCopyType C>
ChunkResult simd_step(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  using F = typename V::F;
  const F beta1 = V::set1(s.beta1);
  const F beta2 = V::set1(s.beta2);
  const F omb1 = V::set1(s.one_minus_beta1);
  const F omb2 = V::set1(s.one_minus_beta2);
  const F eps = V::set1(s.eps);
  const F wd = V::set1(s.weight_decay);
  const F decay = V::set1(s.decay);
  const F step_size = V::set1(s.step_size);
  const F inv_sqrt_bc2 = V::set1(s.inv_sqrt_bc2);
  const F scale = V::set1(s.grad_scale);
  typename V::Acc acc{};
  for (uint64_t i = begin; i < end; i += V::kWidth) {
    F g = V::mul(V::template grad<G>(t.grad, i), scale);
    V::add_sq(g, acc);
    F p = V::load(t.master + i);
    g = V::fmadd(wd, p, g);  // L2 form (wd is 0 for AdamW)
    p = V::mul(p, decay);    // AdamW form (decay is 1 for L2)
    const F m = V::fmadd(beta1, V::load(t.exp_avg + i), V::mul(omb1, g));
    const F v = V::fmadd(beta2, V::load(t.exp_avg_sq + i), V::mul(V::mul(omb2, g), g));
    const F denom = V::fmadd(V::sqrt(v), inv_sqrt_bc2, eps);
    p = V::fnmadd(step_size, V::div(m, denom), p);
    V::store(t.exp_avg + i, m);
    V::store(t.exp_avg_sq + i, v);
    V::store(t.master + i, p);
    V::template copy<C>(t.param_copy, i, p);
  }
  return {V::sum(acc)};
}

template <class V, GradType G>
ChunkResult simd_step_copy(const AdamTensors& t, uint64_t begin, uint64_t end,
                           const StepScalars& s) {
  switch (t.copy_type) {
    case ParamCopyType::kF16:
      return simd_step<V, G, ParamCopyType::kF16>(t, begin, end, s);
    case ParamCopyType::kBF16:
      return simd_step<V, G, ParamCopyType::kBF16>(t, begin, end, s);
    case ParamCopyType::kNone:
      break;
  }
  return simd_step<V, G, ParamCopyType::kNone>(t, begin, end, s);
}

template <class V>
ChunkResult simd_step(const AdamTensors& t, uint64_t begin, uint64_t end, const StepScalars& s) {
  switch (t.grad_type) {
    case GradType::kF16:
      return simd_step_copy<V, GradType::kF16>(t, begin, end, s);
    case GradType::kBF16:
      return simd_step_copy<V, GradType::kBF16>(t, begin, end, s);
    case GradType::kF32:
      break;
  }
  return simd_step_copy<V, GradType::kF32>(t, begin, end, s);
}

template <class V, GradType G>
ChunkResult simd_stats(const void* grad, uint64_t begin, uint64_t end, float scale) {
  const typename V::F vscale = V::set1(scale);
  typename V::Acc acc{};
  for (uint64_t i = begin; i < end; i += V::kWidth) {
    V::add_sq(V::mul(V::template grad<G>(grad, i), vscale), acc);
  }
  return {V::sum(acc)};
}

template <class V>
ChunkResult simd_stats(const void* grad, GradType type, uint64_t begin, uint64_t end, float scale) {
  switch (type) {
    case GradType::kF16:
      return simd_stats<V, GradType::kF16>(grad, begin, end, scale);
    case GradType::kBF16:
      return simd_stats<V, GradType::kBF16>(grad, begin, end, scale);
    case GradType::kF32:
      break;
  }
  return simd_stats<V, GradType::kF32>(grad, begin, end, scale);
}

// dst += src in the gradient's dtype; the statistics are of the stored (rounded) sum, since
// that is what the step will read.
template <class V, GradType G>
ChunkResult simd_accumulate(void* dst, const void* src, uint64_t begin, uint64_t end) {
  typename V::Acc acc{};
  for (uint64_t i = begin; i < end; i += V::kWidth) {
    const typename V::F sum = V::add(V::template grad<G>(dst, i), V::template grad<G>(src, i));
    if constexpr (G == GradType::kF32) {
      V::store(static_cast<float*>(dst) + i, sum);
    } else {
      V::template copy<G == GradType::kF16 ? ParamCopyType::kF16 : ParamCopyType::kBF16>(dst, i,
                                                                                         sum);
    }
    V::add_sq(V::template grad<G>(dst, i), acc);
  }
  return {V::sum(acc)};
}

template <class V>
ChunkResult simd_accumulate(void* dst, const void* src, GradType type, uint64_t begin,
                            uint64_t end) {
  switch (type) {
    case GradType::kF16:
      return simd_accumulate<V, GradType::kF16>(dst, src, begin, end);
    case GradType::kBF16:
      return simd_accumulate<V, GradType::kBF16>(dst, src, begin, end);
    case GradType::kF32:
      break;
  }
  return simd_accumulate<V, GradType::kF32>(dst, src, begin, end);
}

}  // namespace
}  // namespace strata::adam_detail
