// fp16 and bf16 to and from float, rounding to nearest even: the Python module reads parameters
// and adds gradients in the engine's element types on the host.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace strata::python {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000U) << 16;
  const uint32_t exponent = (h >> 10) & 0x1FU;
  const uint32_t mantissa = h & 0x3FFU;
  if (exponent == 0) {  // zero or subnormal: mantissa × 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24F;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000U | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000U);
  uint32_t magnitude = x & 0x7FFFFFFFU;
  if (magnitude >= 0x7F800000U) {  // inf, nan (quiet, payload kept where it fits)
    return static_cast<uint16_t>(
        sign | 0x7C00U | (magnitude > 0x7F800000U ? 0x200U | ((magnitude >> 13) & 0x3FFU) : 0U));
  }
  if (magnitude >= 0x477FF000U) return static_cast<uint16_t>(sign | 0x7C00U);  // rounds to inf
  if (magnitude < 0x38800000U) {  // below 2^-14: a subnormal half (or zero)
    const float scaled = std::bit_cast<float>(magnitude) * 0x1p24F;  // exact
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  magnitude += 0xC8000FFFU + ((magnitude >> 13) & 1U);
  return static_cast<uint16_t>(sign | (magnitude >> 13));
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<uint16_t>((x >> 16) | 0x40U);  // nan
  return static_cast<uint16_t>((x + 0x7FFFU + ((x >> 16) & 1U)) >> 16);
}

}  // namespace strata::python
