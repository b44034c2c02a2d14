// CPU Adam / AdamW: every ISA the CPU has against a double-precision scalar reference.
#include "strata/optimizer/cpu_adam.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace strata {
namespace {

// ---- Independent reference conversions (double arithmetic, not the kernels' bit tricks) -------

// Rounds x to the nearest value with `mant_bits` fraction bits and minimum exponent `min_exp`
// (ties to even), returning +-inf at or beyond 2^(max_exp+1).
double ref_round(double x, int mant_bits, int min_exp, int max_exp) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e = 0;
  std::frexp(std::fabs(x), &e);  // |x| = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, min_exp);
  const double ulp = std::ldexp(1.0, exp - mant_bits);
  const double r = std::nearbyint(std::fabs(x) / ulp) * ulp;  // default rounding: ties to even
  const double mag =
      r >= std::ldexp(1.0, max_exp + 1) ? std::numeric_limits<double>::infinity() : r;
  return std::copysign(mag, x);
}
double ref_half(double x) { return ref_round(x, 10, -14, 15); }
double ref_bf16(double x) { return ref_round(x, 7, -126, 127); }

double decode_half(uint16_t h) {
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  double mag = 0;
  if (exp == 0x1F) {
    mag = mant != 0 ? std::numeric_limits<double>::quiet_NaN()
                    : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    mag = std::ldexp(mant, -24);
  } else {
    mag = std::ldexp(1024 + mant, exp - 25);
  }
  return (h & 0x8000) != 0 ? -mag : mag;
}
double decode_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint16_t bf16_bits_of(float f) {  // exact for values already representable in bf16
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}
uint16_t half_bits_of(double x) {  // exact for values already representable in fp16
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isnan(a)) return sign | 0x7E00;
  if (std::isinf(a)) return sign | 0x7C00;
  if (a < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(a * std::ldexp(1.0, 24));
  int e = 0;
  const double f = std::frexp(a, &e);  // a = f * 2^e
  const auto mant = static_cast<uint16_t>((f * 2 - 1) * 1024);
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | mant;
}

// Whether `copy` is the round-to-nearest-even conversion of `master`, bit for bit (any NaN for a
// NaN master, since the kernels keep NaNs quiet but payloads are not part of the contract).
bool copy_matches(ParamCopyType ct, uint16_t copy, float master) {
  const double got = ct == ParamCopyType::kF16 ? decode_half(copy) : decode_bf16(copy);
  const double want = ct == ParamCopyType::kF16 ? ref_half(master) : ref_bf16(master);
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// ---- Tensors in every gradient type ----------------------------------------------------------

struct Case {
  std::vector<float> master, exp_avg, exp_avg_sq, grad32;
  std::vector<uint16_t> grad16, copy;
  GradType gt = GradType::kF32;
  ParamCopyType ct = ParamCopyType::kNone;

  AdamTensors tensors() {
    AdamTensors t;
    t.master = master.data();
    t.exp_avg = exp_avg.data();
    t.exp_avg_sq = exp_avg_sq.data();
    t.grad = gt == GradType::kF32 ? static_cast<const void*>(grad32.data()) : grad16.data();
    t.grad_type = gt;
    t.param_copy = ct == ParamCopyType::kNone ? nullptr : copy.data();
    t.copy_type = ct;
    t.count = master.size();
    return t;
  }
  // The gradient value the kernel sees, exactly.
  double grad_at(size_t i) const {
    switch (gt) {
      case GradType::kF16:
        return decode_half(grad16[i]);
      case GradType::kBF16:
        return decode_bf16(grad16[i]);
      case GradType::kF32:
        break;
    }
    return grad32[i];
  }
  // Sets element i of the gradient to (the rounding of) x; returns the stored value.
  void set_grad(size_t i, double x) {
    if (gt == GradType::kF32) grad32[i] = static_cast<float>(x);
    if (gt == GradType::kF16) grad16[i] = half_bits_of(ref_half(x));
    if (gt == GradType::kBF16) grad16[i] = bf16_bits_of(static_cast<float>(ref_bf16(x)));
  }
};

Case make_case(GradType gt, ParamCopyType ct, size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  Case c;
  c.gt = gt;
  c.ct = ct;
  c.master.resize(n);
  c.exp_avg.resize(n);
  c.exp_avg_sq.resize(n);
  c.grad32.resize(n);
  c.grad16.resize(n);
  c.copy.resize(n);
  for (size_t i = 0; i < n; ++i) {
    c.master[i] = u(rng);
    c.exp_avg[i] = 0.01F * u(rng);
    c.exp_avg_sq[i] = 1e-4F * std::fabs(u(rng));
  }
  return c;
}

void fill_grads(Case& c, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_int_distribution<int> pick(0, 99);
  const double tiny = c.gt == GradType::kF16 ? std::ldexp(1.0, -16) : 1e-39;  // subnormal range
  for (size_t i = 0; i < c.master.size(); ++i) {
    // About 2% of the gradients are denormal in their own type, to catch flush-to-zero.
    c.set_grad(i, pick(rng) < 2 ? tiny * u(rng) : 0.1 * u(rng));
  }
}

struct Ref {
  double p, m, v, tol_p, tol_m, tol_v, g;
};

// One Adam(W) step in double from the float state before the step, with error bounds for a
// float32 kernel: a few ulps of each operand's magnitude (the terms add without cancellation
// error control), plus an absolute floor for the subnormal range where ulps are absolute.
Ref reference(const AdamParams& hp, double p, double m, double v, double graw) {
  constexpr double kRel = 1e-6;  // ~8 float ulps
  constexpr double kFloor = 1e-44;
  const double g0 = graw * hp.grad_scale;
  double g = g0;
  if (!hp.decoupled) g += hp.weight_decay * p;
  const double p0 = p;
  if (hp.decoupled) p *= 1.0 - static_cast<double>(hp.lr) * hp.weight_decay;
  const double b1 = hp.beta1;
  const double b2 = hp.beta2;
  const double m1 = b1 * m + (1 - b1) * g;
  const double v1 = b2 * v + (1 - b2) * g * g;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(hp.step));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(hp.step));
  const double denom = std::sqrt(v1 / bc2) + hp.eps;
  const double step_size = hp.lr / bc1;
  const double p1 = p - step_size * m1 / denom;
  const double g_mag = std::fabs(g0) + hp.weight_decay * std::fabs(p0);
  const double tol_m = kRel * (std::fabs(m) + g_mag) + kFloor;
  const double tol_v = kRel * (v + g_mag * g_mag) + kFloor;
  const double tol_p = kRel * std::fabs(p0) + 1e-5 * step_size * (std::fabs(m) + g_mag) / denom +
                       step_size * kFloor / hp.eps;
  return {p1, m1, v1, tol_p, tol_m, tol_v, g0};
}

std::string combo(CpuIsa isa, GradType gt, ParamCopyType ct, bool decoupled, size_t n) {
  return std::string(isa_name(isa)) + " grad=" + std::to_string(static_cast<int>(gt)) +
         " copy=" + std::to_string(static_cast<int>(ct)) + (decoupled ? " adamw" : " adam-l2") +
         " n=" + std::to_string(n);
}

constexpr GradType kGradTypes[] = {GradType::kF32, GradType::kF16, GradType::kBF16};
constexpr ParamCopyType kCopyTypes[] = {ParamCopyType::kNone, ParamCopyType::kF16,
                                        ParamCopyType::kBF16};

TEST_CASE("adam_step matches a double reference for every ISA and dtype combination",
          "[offload][adam]") {
  std::mt19937 rng(1234);
  for (CpuIsa isa : supported_isas()) {
    for (GradType gt : kGradTypes) {
      for (ParamCopyType ct : kCopyTypes) {
        for (bool decoupled : {false, true}) {
          for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{33}, size_t{100003}}) {
            const std::string what = combo(isa, gt, ct, decoupled, n);
            Case c = make_case(gt, ct, n, rng);
            AdamParams hp;
            hp.lr = 1e-2F;
            hp.weight_decay = 0.1F;
            hp.decoupled = decoupled;
            hp.grad_scale = 0.75F;
            size_t bad = 0;
            std::string first_bad;
            for (uint64_t step = 1; step <= 3; ++step) {
              hp.step = step;
              fill_grads(c, rng);
              const Case before = c;
              absl::StatusOr<AdamResult> r = adam_step_with(isa, c.tensors(), hp);
              REQUIRE(r.ok());
              double sq = 0;
              for (size_t i = 0; i < n; ++i) {
                const Ref ref = reference(hp, before.master[i], before.exp_avg[i],
                                          before.exp_avg_sq[i], before.grad_at(i));
                sq += ref.g * ref.g;
                const bool ok =
                    std::fabs(c.master[i] - ref.p) <= ref.tol_p &&
                    std::fabs(c.exp_avg[i] - ref.m) <= ref.tol_m &&
                    std::fabs(c.exp_avg_sq[i] - ref.v) <= ref.tol_v &&
                    (ct == ParamCopyType::kNone || copy_matches(ct, c.copy[i], c.master[i]));
                if (!ok && bad++ == 0) {
                  first_bad = "step " + std::to_string(step) + " i=" + std::to_string(i) +
                              " p=" + std::to_string(c.master[i]) + " ref " + std::to_string(ref.p);
                }
              }
              // Relative: the kernel squares float-rounded g (2^-24 each); the margin covers
              // all-denormal tensors, where the float rounding of g*scale is absolute (~1e-45).
              CHECK(r->grad_sq_sum == Approx(sq).epsilon(1e-6).margin(1e-60));
              CHECK_FALSE(r->non_finite);
            }
            INFO(what << " " << first_bad);
            CHECK(bad == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("adam_step copies the states into backups first, for an exact undo", "[offload][adam]") {
  const CpuIsa isa = GENERATE(from_range(supported_isas()));
  INFO(isa_name(isa));
  const uint64_t n = 100003;  // several chunks and a tail
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0F, 1.0F);
  std::vector<float> master(n), m(n), v(n), grad(n);
  for (uint64_t i = 0; i < n; ++i) {
    master[i] = normal(rng);
    m[i] = normal(rng) * 0.1F;
    v[i] = std::fabs(normal(rng)) * 0.01F;
    grad[i] = normal(rng);
  }
  const auto master0 = master, m0 = m, v0 = v;
  auto plain_master = master, plain_m = m, plain_v = v;
  AdamParams p;
  p.step = 4;
  AdamTensors plain{plain_master.data(), plain_m.data(), plain_v.data(), grad.data()};
  plain.count = n;
  REQUIRE(adam_step_with(isa, plain, p).ok());
  std::vector<float> bm(n, -1.0F), ba(n, -1.0F), bv(n, -1.0F);
  AdamTensors t{master.data(), m.data(), v.data(), grad.data()};
  t.count = n;
  t.backup_master = bm.data();
  t.backup_exp_avg = ba.data();
  t.backup_exp_avg_sq = bv.data();
  REQUIRE(adam_step_with(isa, t, p).ok());
  CHECK(bm == master0);
  CHECK(ba == m0);
  CHECK(bv == v0);
  CHECK(std::memcmp(master.data(), plain_master.data(), n * 4) == 0);
  CHECK(std::memcmp(m.data(), plain_m.data(), n * 4) == 0);
  CHECK(std::memcmp(v.data(), plain_v.data(), n * 4) == 0);
  t.backup_exp_avg = nullptr;  // two of three: refused before anything changes
  auto refused = adam_step_with(isa, t, p);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("all set or none"));
}

TEST_CASE("the parameter copy rounds special master values to nearest even", "[offload][adam]") {
  const float kInf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {0.0F,
                                       -0.0F,
                                       1.0F,
                                       -1.0F,
                                       1e-40F,
                                       -1e-42F,
                                       1.4e-45F,  // zeros and float denormals
                                       std::ldexp(1.0F, -24),
                                       std::ldexp(1.5F, -24),
                                       std::ldexp(2.5F, -24),  // fp16 ties
                                       std::ldexp(1.0F, -25),
                                       std::ldexp(1.0F, -26),
                                       std::ldexp(1023.5F, -24),
                                       std::ldexp(1.0F, -14),
                                       1.0F + std::ldexp(1.0F, -11),
                                       1.0F + std::ldexp(3.0F, -11),
                                       1.0F + std::ldexp(1.0F, -8),
                                       1.0F + std::ldexp(3.0F, -8),
                                       1.0F + std::ldexp(1.0F, -9),
                                       65504.0F,
                                       65519.0F,
                                       65520.0F,
                                       -70000.0F,
                                       1e30F,
                                       3.4e38F,
                                       kInf,
                                       -kInf,
                                       std::numeric_limits<float>::quiet_NaN(),
                                       std::nanf("0x1234"),
                                       0.1F,
                                       -0.3F,
                                       123.456F,
                                       std::ldexp(1.0F, -126),
                                       std::ldexp(1.0F, -130),
                                       7e-39F,
                                       1e-5F,
                                       -2e-7F};
  for (CpuIsa isa : supported_isas()) {
    for (ParamCopyType ct : {ParamCopyType::kF16, ParamCopyType::kBF16}) {
      // lr = 0 and wd = 0 leave the master as it is, so the copy is the conversion of it.
      Case c;
      c.ct = ct;
      c.master = specials;
      c.exp_avg.assign(specials.size(), 0.0F);
      c.exp_avg_sq.assign(specials.size(), 0.0F);
      c.grad32.assign(specials.size(), 0.0F);
      c.copy.assign(specials.size(), 0);
      AdamParams hp;
      hp.lr = 0.0F;
      REQUIRE(adam_step_with(isa, c.tensors(), hp).ok());
      for (size_t i = 0; i < specials.size(); ++i) {
        INFO(isa_name(isa) << " copy=" << static_cast<int>(ct) << " value " << specials[i]
                           << " bits " << c.copy[i]);
        CHECK(copy_matches(ct, c.copy[i], c.master[i]));
      }
    }
  }
}

TEST_CASE("denormal gradients are not flushed to zero", "[offload][adam]") {
  for (CpuIsa isa : supported_isas()) {
    for (GradType gt : kGradTypes) {
      std::mt19937 rng(7);
      Case c = make_case(gt, ParamCopyType::kNone, 45, rng);
      const double tiny = gt == GradType::kF16 ? std::ldexp(1.0, -20) : 1e-40;
      for (size_t i = 0; i < c.master.size(); ++i) c.set_grad(i, tiny);
      std::fill(c.exp_avg.begin(), c.exp_avg.end(), 0.0F);
      REQUIRE(c.grad_at(0) > 0);
      AdamParams hp;
      absl::StatusOr<AdamResult> r = adam_step_with(isa, c.tensors(), hp);
      REQUIRE(r.ok());
      INFO(isa_name(isa) << " grad=" << static_cast<int>(gt));
      CHECK(r->grad_sq_sum > 0);
      for (size_t i = 0; i < c.master.size(); ++i) {
        CHECK(c.exp_avg[i] == Approx((1 - 0.9) * c.grad_at(i)).epsilon(1e-3));
      }
    }
  }
}

TEST_CASE("inf and nan gradients set non_finite in adam_step and grad_stats", "[offload][adam]") {
  const double kInf = std::numeric_limits<double>::infinity();
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  for (CpuIsa isa : supported_isas()) {
    for (GradType gt : kGradTypes) {
      for (double bad : {kInf, -kInf, kNan}) {
        for (size_t pos : {size_t{0}, size_t{5}, size_t{17}, size_t{36}}) {  // SIMD body, tail
          std::mt19937 rng(11);
          Case c = make_case(gt, ParamCopyType::kBF16, 37, rng);
          fill_grads(c, rng);
          AdamParams hp;
          absl::StatusOr<AdamResult> clean = grad_stats_with(isa, c.tensors().grad, gt, 37, 1.0F);
          REQUIRE(clean.ok());
          CHECK_FALSE(clean->non_finite);
          c.set_grad(pos, bad);
          INFO(isa_name(isa) << " grad=" << static_cast<int>(gt) << " bad=" << bad << " at "
                             << pos);
          absl::StatusOr<AdamResult> stats = grad_stats_with(isa, c.tensors().grad, gt, 37, 1.0F);
          REQUIRE(stats.ok());
          CHECK(stats->non_finite);
          absl::StatusOr<AdamResult> step = adam_step_with(isa, c.tensors(), hp);
          REQUIRE(step.ok());
          CHECK(step->non_finite);
        }
      }
    }
  }
}

TEST_CASE("grad_stats equals the sum adam_step reports", "[offload][adam]") {
  for (CpuIsa isa : supported_isas()) {
    for (GradType gt : kGradTypes) {
      std::mt19937 rng(5);
      Case c = make_case(gt, ParamCopyType::kNone, 70001, rng);
      fill_grads(c, rng);
      double sq = 0;
      for (size_t i = 0; i < c.master.size(); ++i) {
        const double g = c.grad_at(i) * 0.5;  // exact scale: the reference sum is exact-ish
        sq += g * g;
      }
      absl::StatusOr<AdamResult> stats = grad_stats_with(isa, c.tensors().grad, gt, 70001, 0.5F);
      AdamParams hp;
      hp.grad_scale = 0.5F;
      absl::StatusOr<AdamResult> step = adam_step_with(isa, c.tensors(), hp);
      REQUIRE(stats.ok());
      REQUIRE(step.ok());
      INFO(isa_name(isa) << " grad=" << static_cast<int>(gt));
      CHECK(stats->grad_sq_sum == step->grad_sq_sum);  // same ISA, same chunks, same order
      CHECK(stats->grad_sq_sum == Approx(sq).epsilon(1e-12));
    }
  }
}

TEST_CASE("grad_accumulate adds in the gradient's dtype, rounded to nearest even",
          "[offload][adam]") {
  // Odd length: the SIMD body and the scalar tail both run; values near the fp16 limit overflow.
  constexpr size_t kCount = 40007;
  for (CpuIsa isa : supported_isas()) {
    for (GradType gt : kGradTypes) {
      INFO(isa_name(isa) << " grad=" << static_cast<int>(gt));
      std::mt19937 rng(17);
      std::normal_distribution<double> n(0.0, 3.0);
      std::vector<double> a(kCount), b(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        a[i] = n(rng);
        b[i] = n(rng);
      }
      a[5] = 65000.0;  // fp16: 65000 + 65000 overflows to inf
      b[5] = 65000.0;
      a[6] = 1e-7;  // fp16 subnormals
      b[6] = 2e-7;
      std::vector<uint16_t> dst16(kCount), src16(kCount);
      std::vector<float> dst32(kCount), src32(kCount);
      auto encode = [&](double x) {
        return gt == GradType::kF16 ? half_bits_of(ref_half(x))
                                    : bf16_bits_of(static_cast<float>(ref_bf16(x)));
      };
      auto decode = [&](uint16_t h) {
        return gt == GradType::kF16 ? decode_half(h) : decode_bf16(h);
      };
      double expected_sq = 0;
      bool expected_inf = false;
      std::vector<double> expected(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        if (gt == GradType::kF32) {
          dst32[i] = static_cast<float>(a[i]);
          src32[i] = static_cast<float>(b[i]);
          expected[i] = static_cast<double>(dst32[i] + src32[i]);
        } else {
          dst16[i] = encode(a[i]);
          src16[i] = encode(b[i]);
          const double sum = decode(dst16[i]) + decode(src16[i]);  // exact in double
          expected[i] = gt == GradType::kF16 ? ref_half(sum) : ref_bf16(sum);
        }
        if (std::isinf(expected[i])) {
          expected_inf = true;
        } else {
          expected_sq += expected[i] * expected[i];
        }
      }
      void* dst = gt == GradType::kF32 ? static_cast<void*>(dst32.data()) : dst16.data();
      const void* src = gt == GradType::kF32 ? static_cast<void*>(src32.data()) : src16.data();
      absl::StatusOr<AdamResult> r = grad_accumulate_with(isa, dst, src, gt, kCount);
      REQUIRE(r.ok());
      for (size_t i = 0; i < kCount; ++i) {
        const double got = gt == GradType::kF32 ? dst32[i] : decode(dst16[i]);
        if (got != expected[i]) {
          FAIL_CHECK("element " << i << ": " << got << " != " << expected[i]);
          break;
        }
      }
      CHECK(r->non_finite == expected_inf);
      CHECK(expected_inf == (gt == GradType::kF16));
      if (!expected_inf) CHECK(r->grad_sq_sum == Approx(expected_sq).epsilon(1e-12));
      // The statistics equal grad_stats over the result.
      absl::StatusOr<AdamResult> stats = grad_stats_with(isa, dst, gt, kCount, 1.0F);
      REQUIRE(stats.ok());
      CHECK(stats->non_finite == r->non_finite);
      if (!expected_inf) CHECK(stats->grad_sq_sum == Approx(r->grad_sq_sum).epsilon(1e-12));
    }
  }
  CHECK(grad_accumulate(nullptr, nullptr, GradType::kF16, 0)->grad_sq_sum == 0);
  CHECK(grad_accumulate(nullptr, nullptr, GradType::kF16, 3).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("results are bit-identical from run to run", "[offload][adam]") {
  for (CpuIsa isa : supported_isas()) {
    std::mt19937 rng(3);
    Case a = make_case(GradType::kF32, ParamCopyType::kBF16, 300001, rng);  // many chunks
    fill_grads(a, rng);
    Case b = a;
    AdamParams hp;
    hp.weight_decay = 0.01F;
    hp.decoupled = true;
    absl::StatusOr<AdamResult> ra = adam_step_with(isa, a.tensors(), hp);
    absl::StatusOr<AdamResult> rb = adam_step_with(isa, b.tensors(), hp);
    REQUIRE(ra.ok());
    REQUIRE(rb.ok());
    INFO(isa_name(isa));
    CHECK(ra->grad_sq_sum == rb->grad_sq_sum);
    CHECK(a.master == b.master);
    CHECK(a.exp_avg_sq == b.exp_avg_sq);
    CHECK(a.copy == b.copy);
  }
}

// One hyper-parameter struct with one set of defaults (issue 13): the kernels' AdamParams is
// AdamHyper plus the call's step and scale, so their defaults cannot drift apart again.
TEST_CASE("the kernels share AdamHyper and its defaults", "[offload][adam]") {
  static_assert(std::is_base_of_v<AdamHyper, AdamParams>);
  const AdamHyper hyper;
  const AdamParams params;
  CHECK(hyper.lr == 1e-3F);
  CHECK(hyper.beta1 == 0.9F);
  CHECK(hyper.beta2 == 0.999F);
  CHECK(hyper.eps == 1e-8F);
  CHECK(hyper.weight_decay == 0.0F);
  CHECK(hyper.decoupled);  // AdamW; the kernels' default was Adam (L2) before
  CHECK(params.decoupled == hyper.decoupled);
  CHECK(params.weight_decay == hyper.weight_decay);
  CHECK(params.step == 1);
  CHECK(params.grad_scale == 1.0F);

  CHECK(validate_adam(hyper).ok());
  AdamHyper bad;
  bad.beta1 = 1.5F;
  CHECK(validate_adam(bad).message() == "beta1 1.5 must be in [0, 1)");
  bad = {};
  bad.weight_decay = -1;
  CHECK(validate_adam(bad).message() == "weight_decay -1 must be finite and >= 0");
  // The kernels report the same rule under their own name.
  AdamParams p;
  p.eps = 0;
  AdamTensors t;
  CHECK(adam_step(t, p).status().message() == "adam_step: eps 0 must be finite and > 0");
}

TEST_CASE("zero-length tensors need no buffers", "[offload][adam]") {
  for (CpuIsa isa : supported_isas()) {
    AdamTensors t;  // all null, count 0
    t.copy_type = ParamCopyType::kF16;
    absl::StatusOr<AdamResult> r = adam_step_with(isa, t, AdamParams{});
    REQUIRE(r.ok());
    CHECK(r->grad_sq_sum == 0.0);
    CHECK_FALSE(r->non_finite);
    absl::StatusOr<AdamResult> s = grad_stats_with(isa, nullptr, GradType::kBF16, 0, 1.0F);
    REQUIRE(s.ok());
    CHECK(s->grad_sq_sum == 0.0);
  }
}

TEST_CASE("invalid arguments are InvalidArgument naming the field", "[offload][adam]") {
  std::mt19937 rng(1);
  Case c = make_case(GradType::kF32, ParamCopyType::kF16, 9, rng);
  fill_grads(c, rng);
  const Case before = c;
  auto expect = [&](const AdamTensors& t, const AdamParams& p, const std::string& field) {
    absl::StatusOr<AdamResult> r = adam_step(t, p);
    INFO(field << ": " << r.status());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(r.status().message()).find(field) != std::string::npos);
  };
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  AdamParams p;
  p.lr = -1;
  expect(c.tensors(), p, "lr");
  p = {};
  p.lr = kNan;
  expect(c.tensors(), p, "lr");
  p = {};
  p.beta1 = 1.0F;
  expect(c.tensors(), p, "beta1");
  p = {};
  p.beta2 = -0.1F;
  expect(c.tensors(), p, "beta2");
  p = {};
  p.eps = 0;
  expect(c.tensors(), p, "eps");
  p = {};
  p.weight_decay = -1;
  expect(c.tensors(), p, "weight_decay");
  p = {};
  p.grad_scale = std::numeric_limits<float>::infinity();
  expect(c.tensors(), p, "grad_scale");
  p = {};
  p.step = 0;
  expect(c.tensors(), p, "step");
  AdamTensors t = c.tensors();
  t.master = nullptr;
  expect(t, {}, "master");
  t = c.tensors();
  t.exp_avg = nullptr;
  expect(t, {}, "exp_avg");
  t = c.tensors();
  t.exp_avg_sq = nullptr;
  expect(t, {}, "exp_avg_sq");
  t = c.tensors();
  t.grad = nullptr;
  expect(t, {}, "grad");
  t = c.tensors();
  t.param_copy = nullptr;
  expect(t, {}, "param_copy");
  // A rejected call touches nothing.
  CHECK(c.master == before.master);
  CHECK(c.exp_avg == before.exp_avg);
  CHECK(c.copy == before.copy);
  absl::StatusOr<AdamResult> s = grad_stats(nullptr, GradType::kF32, 3, 1.0F);
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("adam_isa names the best ISA the CPU supports", "[offload][adam]") {
  const std::vector<CpuIsa> isas = supported_isas();
  REQUIRE_FALSE(isas.empty());
  CHECK(isas.front() == CpuIsa::kScalar);
  CHECK(adam_isa() == isa_name(isas.back()));
}

}  // namespace
}  // namespace strata
