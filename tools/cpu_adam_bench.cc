// cpu-adam-bench: CPU Adam throughput per ISA against a memory-bandwidth floor measured in the
// same process (docs/cpu_adam.md). A measurement, not a test: nothing here asserts on time.
//
//   cpu-adam-bench [--mparams=64] [--repeat=5] [--placement [--threads=N] [--reserve-cores=N]]
//
// --placement also times the best ISA on a CpuPool (cpu_pool.h: the states' NUMA node, cores
// left free, threads pinned; settings from STRATA_ADAM_* unless the flags give them) against
// the same kernel on every core unpinned, alternating the two (ABBA), and prints the ratio.
#include <absl/strings/str_format.h>
#include <oneapi/tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.h"
#include "strata/base/format_bytes.h"
#include "strata/config/config.h"
#include "strata/optimizer/cpu_adam.h"
#include "strata/optimizer/cpu_pool.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mparams = 64;
  uint64_t repeat = 5;
  strata::cli::FlagSet flags(
      "cpu-adam-bench",
      "CPU Adam throughput per ISA against a memory-bandwidth floor measured "
      "in the same run (fp32 gradients, bf16 parameter copy).");
  flags.add_uint64("mparams", &mparams, "parameters, in units of 2^20");
  flags.add_uint64("repeat", &repeat, "timed repetitions after one warm-up; the best is reported");
  bool placement = false;
  uint64_t threads = UINT64_MAX;
  uint64_t reserve = UINT64_MAX;
  flags.add_bool("placement", &placement,
                 "also time the best ISA on a placed, pinned CpuPool against every core unpinned "
                 "(ABBA), and print the ratio");
  flags.add_uint64("threads", &threads,
                   "with --placement: the pool's threads (0: the node's CPUs); default "
                   "STRATA_ADAM_THREADS");
  flags.add_uint64("reserve-cores", &reserve,
                   "with --placement: CPUs the pool leaves free; default STRATA_ADAM_RESERVE");
  std::vector<std::string> positional;
  if (auto exit_code = flags.parse_or_exit(argc, argv, &positional)) return *exit_code;
  if (!positional.empty()) return flags.usage_error("unexpected argument '" + positional[0] + "'");
  if (mparams == 0 || mparams > (uint64_t{1} << 20)) {
    return flags.usage_error("--mparams: must be between 1 and 1048576");
  }
  if (repeat == 0 || repeat > 1000)
    return flags.usage_error("--repeat: must be between 1 and 1000");
  const uint64_t n = mparams << 20;
  // master, m, v, grad (4 B each), the bf16 copy (2 B) and the 8 B-per-parameter floor buffer.
  const uint64_t needed = n * 26;
  const uint64_t physical =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (needed > physical / 10 * 8) {
    return strata::cli::print_error(
        "cpu-adam-bench",
        absl::StrFormat("--mparams=%u needs %s of memory but this machine has %s; lower --mparams",
                        mparams, strata::format_bytes(needed), strata::format_bytes(physical)),
        strata::cli::kUsageExitCode);
  }
  const int repeats = static_cast<int>(repeat);
  std::vector<float> master(n, 0.5F), m(n, 0.0F), v(n, 0.0F), grad(n, 1e-3F);
  std::vector<uint16_t> copy(n, 0);

  // Floor: every thread updates a buffer in place (a *= k: read 4 B, write 4 B per element), the
  // access shape of the step, which writes back the lines it read; a copy to a second buffer would
  // add read-for-ownership traffic the step does not have. Best of `repeats`.
  std::vector<float> a(n * 2, 1.0F);
  double stream_best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#if defined(STRATA_TSAN)
    // Debian's oneTBB is not built with ThreadSanitizer (its inlined headers race with its
    // library in TSan's eyes, as cpu_adam.cc says): the TSan build measures the floor on one
    // thread, a figure that build never reports as a speed anyway.
    for (float& x : a) x *= 1.0001F;
#else
    tbb::parallel_for(tbb::blocked_range<uint64_t>(0, a.size(), 1 << 16),
                      [&](const tbb::blocked_range<uint64_t>& rg) {
                        for (uint64_t i = rg.begin(); i != rg.end(); ++i) a[i] *= 1.0001F;
                      });
#endif
    if (r > 0) stream_best = std::min(stream_best, seconds_since(t0));
  }
  const double stream_gbs = static_cast<double>(a.size()) * 8 / stream_best / 1e9;
  std::printf("params %llu M, in-place read+write floor: %.2f GB/s\n",
              static_cast<unsigned long long>(n >> 20), stream_gbs);

  strata::AdamTensors t{master.data(),
                        m.data(),
                        v.data(),
                        grad.data(),
                        strata::GradType::kF32,
                        copy.data(),
                        strata::ParamCopyType::kBF16,
                        n};
  // Read grad, master, m, v (16 B); write master, m, v (12 B) and the bf16 copy (2 B).
  constexpr double kBytesPerParam = 30;
  for (strata::CpuIsa isa : strata::supported_isas()) {
    strata::AdamParams p;
    double best = 1e30;
    for (int r = 0; r < repeats + 1; ++r) {
      p.step = static_cast<uint64_t>(r + 1);
      const auto t0 = std::chrono::steady_clock::now();
      if (!strata::adam_step_with(isa, t, p).ok()) return 1;
      if (r > 0) best = std::min(best, seconds_since(t0));
    }
    const double gbs = static_cast<double>(n) * kBytesPerParam / best / 1e9;
    std::printf("%-7s %8.1f ms  %6.2f GB/s  %5.1f%% of floor\n",
                std::string(strata::isa_name(isa)).c_str(), best * 1e3, gbs,
                100 * gbs / stream_gbs);
  }
  if (!placement) return 0;

  // The pool against every core unpinned, same kernel (the best ISA), alternating A B B A so
  // that drift (turbo, other tenants) falls on both.
  absl::StatusOr<strata::Config> config = strata::Config::from_environment();
  if (!config.ok()) {
    return strata::cli::print_error("cpu-adam-bench", std::string(config.status().message()));
  }
  strata::CpuPoolSettings settings = config->adam_pool;
  if (threads != UINT64_MAX) settings.threads = static_cast<uint32_t>(threads);
  if (reserve != UINT64_MAX) settings.reserve_cores = static_cast<uint32_t>(reserve);
  absl::StatusOr<std::unique_ptr<strata::CpuPool>> pool = strata::CpuPool::create(settings);
  if (!pool.ok()) {
    return strata::cli::print_error("cpu-adam-bench", std::string(pool.status().message()),
                                    strata::cli::kUsageExitCode);
  }
  double best[2] = {1e30, 1e30};  // unpinned, pool
  uint64_t step = 1;
  for (int r = 0; r < repeats + 1; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int which = (r % 2 == 0) ? k : 1 - k;
      strata::AdamParams p;
      p.step = step++;
      const auto t0 = std::chrono::steady_clock::now();
      if (!strata::adam_step_with(strata::CpuIsa::kAuto, t, p, which == 1 ? pool->get() : nullptr)
               .ok()) {
        return 1;
      }
      if (r > 0) best[which] = std::min(best[which], seconds_since(t0));
    }
  }
  const std::optional<strata::CpuPlacement> placed = (*pool)->placement();
  std::printf("placement: %s\n", placed ? placed->reason.c_str() : "?");
  std::printf("unpinned %8.1f ms, pool %8.1f ms: pool/unpinned time %.3f (%.2fx speed)\n",
              best[0] * 1e3, best[1] * 1e3, best[1] / best[0], best[0] / best[1]);
  return 0;
}
