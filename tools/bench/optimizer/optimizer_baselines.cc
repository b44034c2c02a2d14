#include "bench/optimizer/optimizer_baselines.h"

#include <absl/strings/str_format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "strata/base/format_bytes.h"

namespace strata::bench {
namespace {

// Lines (16 elements: 64 bytes of each buffer) per task: 256 KiB of each buffer.
constexpr uint64_t kLinesPerTask = uint64_t{4} << 10;

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Runs body(begin, end) over [0, elements) on every core, split at line boundaries (so every
// range but the last starts and ends 64-byte aligned in page-aligned buffers), with the same
// static partition each time, so that each thread touches the pages it first touched.
template <typename Body>
void parallel(uint64_t elements, const Body& body) {
  const uint64_t lines = (elements + 15) / 16;
#if defined(STRATA_TSAN)
  // Debian's oneTBB is not built with ThreadSanitizer (as in offload/cpu_adam.cc): the TSan
  // build splits the same lines over plain threads so the passes themselves stay checked.
  const uint64_t threads = std::max<uint64_t>(2, std::thread::hardware_concurrency());
  std::vector<std::thread> workers;
  for (uint64_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t begin = lines * t / threads;
      const uint64_t end = lines * (t + 1) / threads;
      if (begin < end) body(begin * 16, std::min(end * 16, elements));
    });
  }
  for (auto& worker : workers) worker.join();
#else
  tbb::parallel_for(
      tbb::blocked_range<uint64_t>(0, lines, kLinesPerTask),
      [&](const tbb::blocked_range<uint64_t>& range) {
        body(range.begin() * 16, std::min(range.end() * 16, elements));
      },
      tbb::static_partitioner());
#endif
}

template <typename Grad, typename ToFloat, typename FromFloat>
void naive_loop(const AdamHyper& h, uint64_t step, float* master, float* exp_avg, float* exp_avg_sq,
                const Grad* grad, Grad* copy, uint64_t count, const ToFloat& to_float,
                const FromFloat& from_float) {
  const float bias1 = 1.0F - std::pow(h.beta1, static_cast<float>(step));
  const float bias2 = 1.0F - std::pow(h.beta2, static_cast<float>(step));
  const bool l2 = !h.decoupled;
  for (uint64_t i = 0; i < count; ++i) {
    float g = to_float(grad[i]);
    float p = master[i];
    if (l2) {
      g = g + h.weight_decay * p;  // torch.optim.Adam: L2 decay added to the gradient
    } else {
      p = p * (1.0F - h.lr * h.weight_decay);  // torch.optim.AdamW: decoupled decay
    }
    const float m = h.beta1 * exp_avg[i] + (1.0F - h.beta1) * g;
    const float v = h.beta2 * exp_avg_sq[i] + (1.0F - h.beta2) * g * g;
    const float m_hat = m / bias1;
    const float v_hat = v / bias2;
    p = p - h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    copy[i] = from_float(p);
  }
}

}  // namespace

uint16_t float_to_half(float value) {
  const uint32_t x = bits_of(value);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000U);
  const uint32_t biased = (x >> 23) & 0xFFU;
  uint32_t mantissa = x & 0x7FFFFFU;
  if (biased == 0xFF) {  // inf stays inf, nan stays a (quiet) nan
    return static_cast<uint16_t>(sign | 0x7C00U | (mantissa != 0 ? 0x200U : 0U));
  }
  const int exponent = static_cast<int>(biased) - 127 + 15;
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7C00U);  // overflow: inf
  if (exponent <= 0) {                                               // subnormal or zero
    if (exponent < -10) return sign;
    mantissa |= 0x800000U;
    const auto shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1U << shift) - 1);
    const uint32_t middle = 1U << (shift - 1);
    if (rest > middle || (rest == middle && (half & 1U) != 0)) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFFU;
  // A carry out of the mantissa rounds up into the exponent, which is the right result.
  if (rest > 0x1000U || (rest == 0x1000U && (half & 1U) != 0)) ++half;
  return static_cast<uint16_t>(sign | half);
}

float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000U) << 16;
  const uint32_t exponent = (half >> 10) & 0x1FU;
  const uint32_t mantissa = half & 0x3FFU;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return float_of(sign | 0x7F800000U | (mantissa << 13));
  return float_of(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

uint16_t float_to_bf16(float value) {
  const uint32_t x = bits_of(value);
  if ((x & 0x7FFFFFFFU) > 0x7F800000U) return static_cast<uint16_t>((x >> 16) | 0x40U);  // nan
  return static_cast<uint16_t>((x + 0x7FFFU + ((x >> 16) & 1U)) >> 16);
}

float bf16_to_float(uint16_t bf16) { return float_of(static_cast<uint32_t>(bf16) << 16); }

void fill_values(std::byte* out, uint64_t count, const std::string& dtype, float scale,
                 uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (uint64_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    // In [0.25, 1) x scale, either sign: far from zero and from fp16's subnormals.
    const float unit = static_cast<float>(state >> 40) / static_cast<float>(uint64_t{1} << 24);
    const float value = ((state >> 20) & 1U) != 0 ? -(0.25F + 0.75F * unit) * scale
                                                  : (0.25F + 0.75F * unit) * scale;
    if (dtype == "fp32") {
      std::memcpy(out + i * 4, &value, 4);
    } else {
      const uint16_t bits = dtype == "fp16" ? float_to_half(value) : float_to_bf16(value);
      std::memcpy(out + i * 2, &bits, 2);
    }
  }
}

void TriadBuffers::Free::operator()(float* p) const { std::free(p); }

absl::StatusOr<TriadBuffers> TriadBuffers::create(uint64_t elements) {
  const uint64_t bytes = (elements * sizeof(float) + 4095) / 4096 * 4096;
  auto* a = static_cast<float*>(std::aligned_alloc(4096, bytes));
  auto* b = static_cast<float*>(std::aligned_alloc(4096, bytes));
  auto* c = static_cast<float*>(std::aligned_alloc(4096, bytes));
  TriadBuffers buffers(elements, a, b, c);
  if (a == nullptr || b == nullptr || c == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "optimizer: cannot allocate the floor's three buffers of %s each; lower --params",
        format_bytes(bytes)));
  }
  // b and c as the triad reads them; c stays positive so that the naive loop can use it as v.
  parallel(elements, [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      a[i] = 0.0F;
      b[i] = 0.01F;
      c[i] = 1e-4F;
    }
  });
  return buffers;
}

uint32_t TriadBuffers::threads() {
  return static_cast<uint32_t>(tbb::this_task_arena::max_concurrency());
}

#if defined(__SSE2__)
constexpr bool kStreamingStores = true;
#else
constexpr bool kStreamingStores = false;
#endif

void TriadBuffers::triad(float s) {
  float* __restrict a = a_.get();
  const float* __restrict b = b_.get();
  const float* __restrict c = c_.get();
#if defined(__SSE2__)
  const __m128 scale = _mm_set1_ps(s);
  parallel(elements_, [&](uint64_t begin, uint64_t end) {
    uint64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      _mm_stream_ps(a + i, _mm_add_ps(_mm_load_ps(b + i), _mm_mul_ps(scale, _mm_load_ps(c + i))));
    }
    for (; i < end; ++i) a[i] = b[i] + s * c[i];
    _mm_sfence();  // the streamed lines are written before the pass counts as done
  });
#else
  parallel(elements_, [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
  });
#endif
}

void TriadBuffers::in_place(float k) {
  float* __restrict a = a_.get();
  float* __restrict b = b_.get();
  float* __restrict c = c_.get();
#if defined(__SSE2__)
  const __m128 factor = _mm_set1_ps(k);
  parallel(elements_, [&](uint64_t begin, uint64_t end) {
    uint64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      _mm_store_ps(a + i, _mm_mul_ps(factor, _mm_load_ps(a + i)));
      _mm_store_ps(b + i, _mm_mul_ps(factor, _mm_load_ps(b + i)));
      _mm_store_ps(c + i, _mm_mul_ps(factor, _mm_load_ps(c + i)));
    }
    for (; i < end; ++i) {
      a[i] *= k;
      b[i] *= k;
      c[i] *= k;
    }
  });
#else
  parallel(elements_, [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      a[i] *= k;
      b[i] *= k;
      c[i] *= k;
    }
  });
#endif
}

uint64_t TriadBuffers::bytes_per_pass() const { return elements_ * (kStreamingStores ? 12 : 16); }

std::string TriadBuffers::description() {
  return kStreamingStores ? "non-temporal stores, 12 B per element"
                          : "plain stores, 16 B per element with the write-allocate read";
}

AdamHyper workload_hyper() {
  AdamHyper hyper;
  hyper.weight_decay = 0.01F;
  return hyper;
}

void naive_adam(const AdamHyper& hyper, uint64_t step, const std::string& dtype, float* master,
                float* exp_avg, float* exp_avg_sq, const std::byte* grad, std::byte* copy,
                uint64_t count) {
  if (dtype == "fp32") {
    naive_loop(
        hyper, step, master, exp_avg, exp_avg_sq, reinterpret_cast<const float*>(grad),
        reinterpret_cast<float*>(copy), count, [](float g) { return g; },
        [](float p) { return p; });
  } else if (dtype == "fp16") {
    naive_loop(
        hyper, step, master, exp_avg, exp_avg_sq, reinterpret_cast<const uint16_t*>(grad),
        reinterpret_cast<uint16_t*>(copy), count, [](uint16_t g) { return half_to_float(g); },
        [](float p) { return float_to_half(p); });
  } else {
    naive_loop(
        hyper, step, master, exp_avg, exp_avg_sq, reinterpret_cast<const uint16_t*>(grad),
        reinterpret_cast<uint16_t*>(copy), count, [](uint16_t g) { return bf16_to_float(g); },
        [](float p) { return float_to_bf16(p); });
  }
}

}  // namespace strata::bench
