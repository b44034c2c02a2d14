// The optimizer workload's two references, measured in the same process as the step
// (bench/optimizer/optimizer_workload.h): the memory-bandwidth triad and the naive scalar Adam
// loop.
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/optimizer/cpu_adam.h"

namespace strata::bench {

// Conversions as a textbook implementation writes them: bit manipulation, round to nearest even.
uint16_t float_to_half(float value);
float half_to_float(uint16_t half);
uint16_t float_to_bf16(float value);
float bf16_to_float(uint16_t bf16);

// `count` values of `dtype` ("fp16", "bf16" or "fp32") at `out`: a repeating pseudo-random
// pattern of magnitude about `scale` (never zero, never subnormal in fp16), the same for the
// same seed.
void fill_values(std::byte* out, uint64_t count, const std::string& dtype, float scale,
                 uint64_t seed);

// The hyper-parameters the step and the naive loop share: torch.optim.AdamW's defaults exactly
// (AdamHyper's, with weight decay 0.01), so that the decay's multiply is part of both.
AdamHyper workload_hyper();

// Three fp32 buffers of `elements` each, page-aligned, first touched by every thread in the
// partition the triad uses (as the step's state is by its kernels).
class TriadBuffers {
 public:
  static absl::StatusOr<TriadBuffers> create(uint64_t elements);
  // Threads the triad (and the Adam kernels, in the same default oneTBB arena size) run on.
  static uint32_t threads();
  uint64_t elements() const { return elements_; }
  float* a() const { return a_.get(); }
  float* b() const { return b_.get(); }
  float* c() const { return c_.get(); }

  // One pass of a[i] = b[i] + s * c[i] over every element on every core (oneTBB). On x86-64 the
  // stores are non-temporal (SSE2 movntps, which every x86-64 CPU has), as a tuned STREAM build
  // makes them, so that the pass moves exactly the 12 bytes per element it counts: a plain
  // store first reads the line it writes (write-allocate), traffic STREAM does not count.
  void triad(float s);
  // Bytes one triad pass moves: 12 per element with non-temporal stores; 16 elsewhere (two
  // reads, the write and the write-allocate read of a plain store).
  uint64_t bytes_per_pass() const;
  // "non-temporal stores, 12 B per element" or its plain-store counterpart, for the output.
  static std::string description();

  // A second reference with the step's own access shape on its state: every element of a, b
  // and c read and written back in place (x = x * k; the workload passes k = -1, so that every
  // store changes the bits), 24 B per element, no write-allocate traffic (the lines were just
  // read). On some machines this shape reaches more bandwidth than the triad, and the step
  // with it.
  void in_place(float k);
  uint64_t in_place_bytes_per_pass() const { return elements_ * 24; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  TriadBuffers(uint64_t elements, float* a, float* b, float* c)
      : elements_(elements), a_(a), b_(b), c_(c) {}
  uint64_t elements_ = 0;
  std::unique_ptr<float, Free> a_, b_, c_;
};

// The naive loop: AdamW (Adam with L2 decay when !hyper.decoupled) as a textbook writes it, one
// element at a time, float math, one thread, no intrinsics, compiled like the rest of the tool.
// `grad` and `copy` hold `count` values of `dtype`; master, m and v are fp32. `step` is 1-based
// (bias correction).
void naive_adam(const AdamHyper& hyper, uint64_t step, const std::string& dtype, float* master,
                float* exp_avg, float* exp_avg_sq, const std::byte* grad, std::byte* copy,
                uint64_t count);

}  // namespace strata::bench
