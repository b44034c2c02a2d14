#include "host_reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace strata::comm_internal {
namespace {

template <typename T>
struct Arith {  // integer and native float types combine as themselves
  using Wide = T;
  static Wide load(T v) { return v; }
  static T store(Wide v) { return v; }
};
template <>
struct Arith<Float16Bits> {
  using Wide = float;
  static float load(Float16Bits v) { return to_float(v); }
  static Float16Bits store(float v) { return to_float16(v); }
};
template <>
struct Arith<BFloat16Bits> {
  using Wide = float;
  static float load(BFloat16Bits v) { return to_float(v); }
  static BFloat16Bits store(float v) { return to_bfloat16(v); }
};

template <typename T, typename Op>
void combine(void* x, const void* y, size_t n) {
  T* a = static_cast<T*>(x);
  const T* b = static_cast<const T*>(y);
  for (size_t i = 0; i < n; ++i) {
    a[i] = Arith<T>::store(Op{}(Arith<T>::load(a[i]), Arith<T>::load(b[i])));
  }
}

struct Plus {
  template <typename W>
  W operator()(W a, W b) const {
    return a + b;
  }
};
struct Max {
  template <typename W>
  W operator()(W a, W b) const {
    return std::max(a, b);
  }
};
struct Min {
  template <typename W>
  W operator()(W a, W b) const {
    return std::min(a, b);
  }
};

template <typename T>
CombineFn combine_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return &combine<T, Plus>;
    case ReduceOp::kMax:
      return &combine<T, Max>;
    case ReduceOp::kMin:
      return &combine<T, Min>;
  }
  return nullptr;
}

template <typename T>
void divide(void* data, size_t n, int divisor) {
  T* p = static_cast<T*>(data);
  using W = typename Arith<T>::Wide;
  for (size_t i = 0; i < n; ++i) {
    p[i] = Arith<T>::store(static_cast<W>(Arith<T>::load(p[i]) / static_cast<W>(divisor)));
  }
}

}  // namespace

CombineFn combine_function(DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kUInt8:
      return combine_for<uint8_t>(op);
    case DataType::kInt32:
      return combine_for<int32_t>(op);
    case DataType::kInt64:
      return combine_for<int64_t>(op);
    case DataType::kFloat16:
      return combine_for<Float16Bits>(op);
    case DataType::kBFloat16:
      return combine_for<BFloat16Bits>(op);
    case DataType::kFloat32:
      return combine_for<float>(op);
    case DataType::kFloat64:
      return combine_for<double>(op);
  }
  return nullptr;
}

void divide_in_place(void* data, size_t n, DataType type, int divisor) {
  switch (type) {
    case DataType::kUInt8:
      return divide<uint8_t>(data, n, divisor);
    case DataType::kInt32:
      return divide<int32_t>(data, n, divisor);
    case DataType::kInt64:
      return divide<int64_t>(data, n, divisor);
    case DataType::kFloat16:
      return divide<Float16Bits>(data, n, divisor);
    case DataType::kBFloat16:
      return divide<BFloat16Bits>(data, n, divisor);
    case DataType::kFloat32:
      return divide<float>(data, n, divisor);
    case DataType::kFloat64:
      return divide<double>(data, n, divisor);
  }
}

float to_float(BFloat16Bits h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

BFloat16Bits to_bfloat16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // stay a quiet NaN
  const uint32_t rounding = 0x7fff + ((u >> 16) & 1);                   // to nearest even
  return {static_cast<uint16_t>((u + rounding) >> 16)};
}

float to_float(Float16Bits h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000) << 16;
  const uint32_t exponent = (h.bits >> 10) & 0x1f;
  const uint32_t mantissa = h.bits & 0x3ff;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa × 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

Float16Bits to_float16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const float a = std::fabs(f);
  if (std::isnan(f)) return {static_cast<uint16_t>(sign | 0x7e00)};
  if (a >= 65520.0f) return {static_cast<uint16_t>(sign | 0x7c00)};  // rounds to infinity
  if (a < 6.103515625e-05f) {  // below the smallest normal: a multiple of 2^-24, rounded
    const float scaled = std::nearbyint(a * 16777216.0f);  // default mode: to nearest even
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(scaled))};
  }
  const uint32_t abs_bits = u & 0x7fffffff;
  const uint32_t rounding = 0xfff + ((abs_bits >> 13) & 1);  // to nearest even
  const uint32_t rounded = abs_bits + rounding;
  return {
      static_cast<uint16_t>(sign | (((rounded >> 23) - 112) << 10) | ((rounded >> 13) & 0x3ff))};
}

}  // namespace strata::comm_internal
