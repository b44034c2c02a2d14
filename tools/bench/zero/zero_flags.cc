// --workload=zero's own flags and the checks that need no job (bench/zero/zero_workload.h).
#include <absl/strings/str_format.h>
#include <absl/strings/strip.h>
#include <absl/time/time.h>

#include <string>

#include "bench/common.h"
#include "bench/zero/zero_workload.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

constexpr uint64_t kMaxLayers = 4096;
constexpr uint64_t kMaxSteps = 10'000;

// "auto" or a size.
std::optional<std::string> parse_auto_size(const std::string& flag, const std::string& text,
                                           std::optional<uint64_t>* out) {
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  if (trimmed == "auto") {
    out->reset();
    return std::nullopt;
  }
  if (trimmed == "0") {  // parse_size takes positive sizes only
    *out = 0;
    return std::nullopt;
  }
  auto size = parse_size(trimmed);
  if (!size.ok()) {
    return absl::StrFormat("--%s=%s: %s; or 'auto'", flag, text,
                           std::string(size.status().message()));
  }
  *out = *size;
  return std::nullopt;
}

}  // namespace

std::vector<cli::Flag*> add_zero3_flags(cli::FlagSet& flags, Zero3FlagText* text) {
  return {
      &flags.add_enum("param-home", &text->param_home, {"gpu", "cpu", "nvme"},
                      "zero: where each rank's parameter shards live (nvme: STRATA_NVME_PATHS or "
                      "a temporary directory, as the NVMe paths do)"),
      &flags.add_string("prefetch-bytes", &text->prefetch_bytes,
                        "zero: gathered bytes fetched ahead of the layer in use (ZeroOptions::"
                        "prefetch_bytes), a size or auto (2 layers); 0: no prefetching"),
      &flags.add_string("max-live-bytes", &text->max_live_bytes,
                        "zero: the most gathered bytes alive at once (ZeroOptions::"
                        "max_live_bytes), a size of at least one layer's, or auto (4 layers)"),
      &flags.add_string("reuse-window-bytes", &text->reuse_window_bytes,
                        "zero: a released layer stays gathered when the order uses it again "
                        "within this many gathered bytes (ZeroOptions::reuse_window_bytes), a "
                        "size or auto (the engine's default); 0: every use gathers"),
      &flags.add_string("layer-compute", &text->layer_compute,
                        "zero: compute per layer in forward and again in backward, as a duration "
                        "(200us, 2ms, 0): real work on the host (y = a*x + y over fp32), its "
                        "amount calibrated to this time at the start"),
  };
}

std::optional<std::string> parse_zero3_flags(const Zero3FlagText& text, Zero3Options* out) {
  out->param_home = text.param_home;
  if (auto error = parse_auto_size("prefetch-bytes", text.prefetch_bytes, &out->prefetch_bytes)) {
    return error;
  }
  if (auto error = parse_auto_size("max-live-bytes", text.max_live_bytes, &out->max_live_bytes)) {
    return error;
  }
  if (auto error = parse_auto_size("reuse-window-bytes", text.reuse_window_bytes,
                                   &out->reuse_window_bytes)) {
    return error;
  }
  absl::Duration d;
  const std::string compute(absl::StripAsciiWhitespace(text.layer_compute));
  if (!absl::ParseDuration(compute, &d)) {
    return absl::StrFormat(
        "--layer-compute=%s: not a duration; write a number and a unit: 200us, 2ms, 1.5ms, 0",
        text.layer_compute);
  }
  out->layer_compute = d;
  return std::nullopt;
}

std::optional<std::string> parse_zero3_stage(uint64_t value) {
  if (value == 3) return std::nullopt;
  return absl::StrFormat(
      "--zero-stage=%d: --workload=zero times stage 3 (parameters partitioned) only; stages 1 "
      "and 2 are timed by --workload=optimizer",
      value);
}

std::optional<std::string> validate(const Zero3Options& o) {
  if (o.layers == 0 || o.layers > kMaxLayers) {
    return absl::StrFormat("--layers=%d: must be between 1 and %d", o.layers, kMaxLayers);
  }
  if (o.layer_bytes < kPage || o.layer_bytes % kPage != 0) {
    return absl::StrFormat("--layer-bytes=%d: must be a multiple of 4KiB, at least 4KiB",
                           o.layer_bytes);
  }
  if (o.layer_bytes > (uint64_t{1} << 32)) {
    return absl::StrFormat("--layer-bytes=%d: at most 4GiB per layer", o.layer_bytes);
  }
  if (o.layer_compute < absl::ZeroDuration() || o.layer_compute > absl::Seconds(10)) {
    return absl::StrFormat("--layer-compute=%s: must be between 0 and 10s",
                           absl::FormatDuration(o.layer_compute));
  }
  if (o.steps == 0 || o.steps > kMaxSteps) {
    return absl::StrFormat("--steps=%d: must be between 1 and %d", o.steps, kMaxSteps);
  }
  if (o.max_live_bytes.has_value() && *o.max_live_bytes < o.layer_bytes) {
    return absl::StrFormat(
        "--max-live-bytes=%d: below one layer's gathered bytes (--layer-bytes=%d); give at "
        "least that, or auto",
        *o.max_live_bytes, o.layer_bytes);
  }
  return std::nullopt;
}

}  // namespace strata::bench
