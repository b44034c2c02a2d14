#include "bench/zero/zero_baselines.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>

#include "bench/common.h"
#include "bench/raw_io.h"
#include "strata/base/size.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kComputeElements = kComputeBufferBytes / sizeof(float);
// Calibration: passes over the buffers, each timed on every rank at once.
constexpr uint64_t kCalibrationPasses = 7;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

absl::Status with_context(const absl::Status& status, std::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrFormat("zero: %s: %s", std::string(what),
                                                     std::string(status.message())));
}

absl::Status finish(absl::StatusOr<std::unique_ptr<CollectiveWork>> work) {
  if (!work.ok()) return work.status();
  return (*work)->synchronize();
}

// Every rank's `value`, the largest.
absl::StatusOr<double> slowest(Communicator& comm, double value) {
  double v = value;
  if (absl::Status s = finish(comm.all_reduce(&v, &v, 1, DataType::kFloat64, ReduceOp::kMax));
      !s.ok()) {
    return s;
  }
  return v;
}

// Runs `body` once untimed, then `samples` times timed after a barrier, each sample's time the
// slowest rank's.
template <typename Body>
absl::StatusOr<std::vector<double>> timed_samples(Communicator& comm, uint64_t samples,
                                                  Body&& body) {
  std::vector<double> out;
  for (uint64_t s = 0; s <= samples; ++s) {
    if (absl::Status st = finish(comm.barrier()); !st.ok()) return st;
    const Clock::time_point start = Clock::now();
    if (absl::Status st = body(); !st.ok()) return st;
    auto t = slowest(comm, since(start));
    if (!t.ok()) return t.status();
    if (s > 0) out.push_back(*t);
  }
  return out;
}

}  // namespace

size_t lower_median_index(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return values[a] < values[b]; });
  return order.empty() ? 0 : order[(order.size() - 1) / 2];
}

double lower_median(const std::vector<double>& values) {
  return values.empty() ? 0 : values[lower_median_index(values)];
}

HostCompute::HostCompute() : x_(kComputeElements), y_(kComputeElements) {
  for (uint64_t i = 0; i < kComputeElements; ++i) {
    x_[i] = 1e-3F * static_cast<float>(i % 1024);
    y_[i] = static_cast<float>(i % 7);
  }
}

double HostCompute::run(uint64_t elements) {
  const Clock::time_point start = Clock::now();
  // The sign alternates call by call, so y returns to where it was instead of growing.
  const float a = (calls_++ % 2 == 0) ? 0.5F : -0.5F;
  float* __restrict y = y_.data();
  const float* __restrict x = x_.data();
  while (elements > 0) {
    const uint64_t n = std::min(elements, kComputeElements - at_);
    for (uint64_t i = at_; i < at_ + n; ++i) y[i] = a * x[i] + y[i];
    elements -= n;
    at_ = (at_ + n) % kComputeElements;
  }
  return since(start);
}

double HostCompute::checksum() const {
  return static_cast<double>(y_[0]) + static_cast<double>(y_[kComputeElements / 2]);
}

absl::StatusOr<ComputeCalibration> HostCompute::calibrate(Communicator& comm,
                                                          absl::Duration layer_compute) {
  ComputeCalibration c;
  for (uint64_t pass = 0; pass <= kCalibrationPasses; ++pass) {
    if (absl::Status st = finish(comm.barrier()); !st.ok()) {
      return with_context(st, "calibrating the compute");
    }
    const double seconds = run(kComputeElements);
    auto ns = slowest(comm, seconds * 1e9 / static_cast<double>(kComputeElements));
    if (!ns.ok()) return with_context(ns.status(), "calibrating the compute");
    if (pass > 0) c.samples_ns.push_back(*ns);  // the first warms the buffers
  }
  c.ns_per_element = lower_median(c.samples_ns);
  const double ns = absl::ToDoubleNanoseconds(layer_compute);
  c.elements_per_layer =
      c.ns_per_element > 0 ? static_cast<uint64_t>(ns / c.ns_per_element + 0.5) : 0;
  return c;
}

absl::StatusOr<RawCollectiveTimes> time_raw_collectives(Runtime& runtime, Communicator& comm,
                                                        TierKind tier, uint64_t shard,
                                                        uint64_t samples,
                                                        uint64_t calls_per_sample) {
  TensorStore& store = runtime.store();
  const uint64_t ranks = static_cast<uint64_t>(comm.size());
  const uint64_t rank = static_cast<uint64_t>(comm.rank());
  constexpr uint64_t kParamBytes = 2;  // fp16
  auto stream = runtime.device().create_stream();
  if (!stream.ok()) return stream.status();
  // The engine's buffers: a gathered layer (the gradient bucket is the same size) and a shard.
  auto gathered = store.create("bench.zero.raw.gathered", ranks * shard * kParamBytes, tier);
  if (!gathered.ok()) return with_context(gathered.status(), "the raw collectives' buffers");
  auto own = store.create("bench.zero.raw.shard", shard * kParamBytes, tier);
  if (!own.ok()) {
    (void)store.destroy(*gathered);
    return with_context(own.status(), "the raw collectives' buffers");
  }
  RawCollectiveTimes r;
  r.calls_per_sample = calls_per_sample;
  absl::Status status = [&]() -> absl::Status {
    auto out = store.acquire(*gathered, tier, **stream, AccessMode::kWrite);
    if (!out.ok()) return out.status();
    auto in = store.acquire(*own, tier, **stream, AccessMode::kWrite);
    if (!in.ok()) return in.status();
    if (absl::Status s = runtime.device().synchronize(**stream); !s.ok()) return s;
    // Zeros: a sum of them stays finite.
    if (runtime.device().backend() == Backend::kHost || tier != TierKind::kGpu) {
      std::fill_n(static_cast<std::byte*>(*out), ranks * shard * kParamBytes, std::byte{0});
      std::fill_n(static_cast<std::byte*>(*in), shard * kParamBytes, std::byte{0});
    }
    CollectiveOptions co;
    if (comm.backend() == CommBackendKind::kNccl) co.stream = stream->get();
    auto gathers = timed_samples(comm, samples, [&]() -> absl::Status {
      for (uint64_t c = 0; c < calls_per_sample; ++c) {
        if (auto s = finish(comm.all_gather(*in, *out, shard, DataType::kFloat16, co)); !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    });
    if (!gathers.ok()) return with_context(gathers.status(), "the raw all_gather");
    // In place, as the engine reduce-scatters a bucket: this rank's slice gets the sum.
    auto* base = static_cast<std::byte*>(*out);
    auto scatters = timed_samples(comm, samples, [&]() -> absl::Status {
      for (uint64_t c = 0; c < calls_per_sample; ++c) {
        if (auto s = finish(comm.reduce_scatter(base, base + rank * shard * kParamBytes, shard,
                                                DataType::kFloat16, ReduceOp::kSum, co));
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    });
    if (!scatters.ok()) return with_context(scatters.status(), "the raw reduce_scatter");
    const double per_call = 1.0 / static_cast<double>(calls_per_sample);
    for (double s : *gathers) r.all_gather_samples.push_back(s * per_call);
    for (double s : *scatters) r.reduce_scatter_samples.push_back(s * per_call);
    r.all_gather_seconds = lower_median(r.all_gather_samples);
    r.reduce_scatter_seconds = lower_median(r.reduce_scatter_samples);
    if (absl::Status s = store.release(*own, **stream); !s.ok()) return s;
    return store.release(*gathered, **stream);
  }();
  if (absl::Status s = runtime.device().synchronize(**stream); !s.ok() && status.ok()) status = s;
  for (TensorHandle t : {*own, *gathered}) {
    if (absl::Status s = store.destroy(t); !s.ok() && status.ok()) status = s;
  }
  if (!status.ok()) return status;
  return r;
}

void merge(RawCollectiveTimes& into, const RawCollectiveTimes& more) {
  into.all_gather_samples.insert(into.all_gather_samples.end(), more.all_gather_samples.begin(),
                                 more.all_gather_samples.end());
  into.reduce_scatter_samples.insert(into.reduce_scatter_samples.end(),
                                     more.reduce_scatter_samples.begin(),
                                     more.reduce_scatter_samples.end());
  into.all_gather_seconds = lower_median(into.all_gather_samples);
  into.reduce_scatter_seconds = lower_median(into.reduce_scatter_samples);
}

absl::StatusOr<RawReadTimes> time_raw_shard_read(Communicator& comm,
                                                 const std::vector<std::string>& dirs,
                                                 uint64_t bytes, uint64_t block, uint32_t depth,
                                                 uint64_t samples) {
  auto raw =
      RawIo::create({.dirs = dirs, .bytes = round_up(bytes), .block = block, .depth = depth});
  // Every rank must know whether the others measure (the samples are collectives).
  double missing = raw.ok() ? 0 : 1;
  auto any_missing = slowest(comm, missing);
  if (!any_missing.ok()) return any_missing.status();
  if (!raw.ok()) return with_context(raw.status(), "the raw NVMe read");
  if (*any_missing > 0) {
    return absl::UnavailableError("zero: the raw NVMe read: another rank could not set it up");
  }
  if (absl::Status s = (*raw)->write_pass(); !s.ok()) {
    return with_context(s, "writing the raw NVMe read's file");
  }
  RawReadTimes r;
  r.bytes = (*raw)->bytes();
  r.buffered_dirs = (*raw)->buffered_dirs();
  auto times = timed_samples(comm, samples, [&] { return (*raw)->read_pass(); });
  if (!times.ok()) return with_context(times.status(), "the raw NVMe read");
  r.samples = *std::move(times);
  r.seconds = lower_median(r.samples);
  r.describe = absl::StrFormat(
      "shard read baseline: fio-equivalent io_uring read of this rank's shard (%s), O_DIRECT, "
      "bs=%s, iodepth=%d, one job per directory (%d), every rank at once%s",
      format_bytes(r.bytes), format_bytes(block), depth, dirs.size(),
      r.buffered_dirs.empty()
          ? ""
          : "; O_DIRECT refused in " + absl::StrJoin(r.buffered_dirs, ",") + ": buffered there");
  return r;
}

}  // namespace strata::bench
