// What the ZeRO tests share: a model of odd-sized parameters in two hyper-parameter groups,
// synthetic gradients that differ per rank, step and micro-step, and a one-rank reference — the
// plain OffloadOptimizer (stage 0) fed the whole global batch's gradient: the sum of every
// rank's, averaged by its grad_divisor (as a one-rank trainer that accumulates N micro-batches
// and divides by N).
//
// Gradients are dyadic (k/64, |k| <= 64): their sums over up to 4 ranks and 2 micro-steps and
// every square are exact in fp16, fp32 and double, so the partitioned run must equal the
// reference bit for bit, whatever the order of the reductions.
#pragma once

#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optimizer/cpu_adam_kernels.h"
#include "strata/comm/communicator.h"
#include "strata/device/host_device.h"
#include "strata/optimizer/offload_optimizer.h"
#include "strata/runtime/runtime.h"
#include "strata/zero/zero_engine.h"

namespace strata::testing {

struct ZeroModel {
  std::vector<ZeroParam> params;  // initial values point into `initial`
  std::vector<std::vector<float>> initial;
};

// `scale` multiplies every size (memory tests use a large one).
inline ZeroModel zero_model(uint64_t scale = 1) {
  struct Shape {
    const char* name;
    std::vector<int64_t> shape;
    uint32_t group;
  };
  const std::vector<Shape> shapes = {
      {"embed.weight", {static_cast<int64_t>(61 * scale), 33}, 0},
      {"block0.attn", {33, static_cast<int64_t>(97 * scale)}, 0},
      {"block0.norm", {33}, 1},
      {"block0.bias", {1}, 1},
      {"block1.mlp", {static_cast<int64_t>(129 * scale), 17}, 0},
      {"head.weight", {static_cast<int64_t>(7 * scale), 5, 3}, 0},
      {"block1.norm", {17}, 1},
  };
  ZeroModel m;
  for (const Shape& s : shapes) {
    uint64_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
    std::vector<float> v(n);
    for (uint64_t i = 0; i < n; ++i) {
      // Varied, deterministic, exactly representable in fp32.
      v[i] =
          static_cast<float>(static_cast<int64_t>((i * 2654435761ULL + n) % 2001) - 1000) / 1024.0F;
    }
    m.initial.push_back(std::move(v));
    ZeroParam& param = m.params.emplace_back();
    param.name = s.name;
    param.shape = s.shape;
    param.group = s.group;
  }
  for (size_t i = 0; i < m.params.size(); ++i) m.params[i].initial = m.initial[i];
  return m;
}

// k/64 with |k| <= 64, from a hash of where it is used.
inline float synthetic_grad(uint64_t step, uint32_t micro, uint32_t rank, uint32_t param,
                            uint64_t i) {
  uint64_t h = step * 0x9E3779B97F4A7C15ULL ^ (micro + 1) * 0xBF58476D1CE4E5B9ULL ^
               (rank + 1) * 0x94D049BB133111EBULL ^ (param + 1) * 0x2545F4914F6CDD1DULL ^ i;
  h ^= h >> 31;
  h *= 0xD6E8FEB86659FD93ULL;
  h ^= h >> 29;
  return static_cast<float>(static_cast<int64_t>(h % 129) - 64) / 64.0F;
}

inline void store_value(void* buffer, GradType type, uint64_t i, float v) {
  switch (type) {
    case GradType::kF32:
      static_cast<float*>(buffer)[i] = v;
      return;
    case GradType::kF16:
      static_cast<uint16_t*>(buffer)[i] = adam_detail::float_to_half(v);
      return;
    case GradType::kBF16:
      static_cast<uint16_t*>(buffer)[i] = adam_detail::float_to_bf16(v);
      return;
  }
}

inline float load_value(const void* buffer, GradType type, uint64_t i) {
  switch (type) {
    case GradType::kF32:
      return static_cast<const float*>(buffer)[i];
    case GradType::kF16:
      return adam_detail::half_to_float(static_cast<const uint16_t*>(buffer)[i]);
    case GradType::kBF16:
      return adam_detail::bf16_to_float(static_cast<const uint16_t*>(buffer)[i]);
  }
  return 0;
}

inline GradType as_grad_type(ParamType t) {
  return t == ParamType::kF32 ? GradType::kF32
                              : (t == ParamType::kF16 ? GradType::kF16 : GradType::kBF16);
}

// The process's host device, shared by every runtime zero_runtime() makes and by the job's
// communicator: Gloo waits on the streams of the device it was created with, so the engines'
// collectives are ordered on their streams as in a trainer (one runtime, one communicator).
inline Device& shared_host_device() {
  static std::unique_ptr<Device> shared = [] {
    auto created = make_host_device();
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      std::abort();
    }
    return *std::move(created);
  }();
  return *shared;
}

// A Device that forwards to one it does not own (a runtime owns its device: each runtime gets
// one of these over the shared host device).
class BorrowedDevice final : public Device {
 public:
  explicit BorrowedDevice(Device& to) : to_(to) {}
  Backend backend() const override { return to_.backend(); }
  std::string description() const override { return to_.description(); }
  int ordinal() const override { return to_.ordinal(); }
  absl::Status make_current() override { return to_.make_current(); }
  absl::StatusOr<MemoryKind> memory_kind(const void* p) override { return to_.memory_kind(p); }
  absl::StatusOr<std::unique_ptr<DeviceMemory>> allocate_device_memory(uint64_t bytes) override {
    return to_.allocate_device_memory(bytes);
  }
  absl::StatusOr<std::unique_ptr<HostRegistration>> register_host(void* data,
                                                                  uint64_t bytes) override {
    return to_.register_host(data, bytes);
  }
  absl::StatusOr<std::unique_ptr<Stream>> create_stream() override { return to_.create_stream(); }
  absl::StatusOr<std::unique_ptr<Event>> create_event() override { return to_.create_event(); }
  absl::StatusOr<std::unique_ptr<Stream>> wrap_external_stream(uintptr_t native) override {
    return to_.wrap_external_stream(native);
  }
  absl::StatusOr<uintptr_t> native_handle(Stream& stream) override {
    return to_.native_handle(stream);
  }
  absl::Status copy_async(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                          Stream& stream) override {
    return to_.copy_async(dst, src, bytes, kind, stream);
  }
  absl::Status launch_host_callback(Stream& stream,
                                    absl::AnyInvocable<void() &&> callback) override {
    return to_.launch_host_callback(stream, std::move(callback));
  }
  absl::StatusOr<std::unique_ptr<HostFlag>> create_host_flag() override {
    return to_.create_host_flag();
  }
  absl::Status raise_host_flag(HostFlag& flag) override { return to_.raise_host_flag(flag); }
  absl::Status wait_host_flag(Stream& stream, HostFlag& flag) override {
    return to_.wait_host_flag(stream, flag);
  }
  absl::Status record(Event& event, Stream& stream) override { return to_.record(event, stream); }
  absl::Status wait(Stream& stream, Event& event) override { return to_.wait(stream, event); }
  absl::StatusOr<bool> query(Event& event) override { return to_.query(event); }
  absl::Status synchronize(Event& event) override { return to_.synchronize(event); }
  absl::Status synchronize(Stream& stream) override { return to_.synchronize(stream); }

 private:
  Device& to_;
};

// The job's communicator, one per process (its rendezvous port can be served only once).
inline Communicator& job_communicator() {
  static std::unique_ptr<Communicator> shared = [] {
    auto created = Communicator::from_environment(&shared_host_device());
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      std::abort();
    }
    return *std::move(created);
  }();
  return *shared;
}

// A host-backend runtime; NVMe in `nvme_dir` when it is not empty.
inline absl::StatusOr<std::unique_ptr<Runtime>> zero_runtime(
    const std::string& nvme_dir, const std::string& gpu_bytes = "64MiB",
    const std::string& cpu_bytes = "64MiB") {
  std::map<std::string, std::string> vars = {
      {"STRATA_BACKEND", "host"}, {"STRATA_GPU_BYTES", gpu_bytes}, {"STRATA_CPU_BYTES", cpu_bytes}};
  if (!nvme_dir.empty()) {
    vars.insert({{"STRATA_NVME_PATHS", nvme_dir},
                 {"STRATA_NVME_BYTES", "64MiB"},
                 {"STRATA_IO_BLOCK", "64KiB"},
                 {"STRATA_STAGING_BYTES", "4MiB"}});
  }
  auto config = Config::from_variables(vars);
  if (!config.ok()) return config.status();
  RuntimeOptions options;
  options.device = std::make_unique<BorrowedDevice>(shared_host_device());
  return Runtime::create(*config, std::move(options));
}

// What a run does each step.
struct ZeroPlan {
  uint32_t micro_steps = 1;
  int64_t overflow_step = -1;  // this step gets an inf gradient (on the last rank)
};

// One micro-step of this rank: every parameter's gradient added in backward order. The host
// writes through the acquired pointers, so it first waits for the stream (which the store made
// wait for earlier work on the buffer, such as the copy of the previous micro-step's gradient).
inline absl::Status zero_micro_step(ZeroEngine& engine, Stream& stream, const ZeroModel& model,
                                    GradType type, uint64_t step, uint32_t micro, uint32_t rank,
                                    bool inf) {
  Device& device = engine.runtime().device();
  for (int p = static_cast<int>(model.params.size()) - 1; p >= 0; --p) {
    const ZeroParamId id{static_cast<uint32_t>(p)};
    auto buffer = engine.acquire_grad(id, TierKind::kGpu, stream);
    if (!buffer.ok()) return buffer.status();
    if (auto st = device.synchronize(stream); !st.ok()) return st;
    const uint64_t n = model.initial[p].size();
    for (uint64_t i = 0; i < n; ++i) {
      const float add = synthetic_grad(step, micro, rank, static_cast<uint32_t>(p), i);
      store_value(*buffer, type, i, load_value(*buffer, type, i) + add);
    }
    if (inf && p == 2) store_value(*buffer, type, 5, INFINITY);
    if (auto st = engine.grad_ready(id, stream); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// The one-rank reference: stage 0 over the same parameters, fed Σ_r g_r (divided by `ranks`).
class ZeroReference {
 public:
  static absl::StatusOr<std::unique_ptr<ZeroReference>> create(const ZeroModel& model,
                                                               const ZeroOptions& options,
                                                               const std::string& nvme_dir,
                                                               uint32_t ranks = 1) {
    auto ref = std::unique_ptr<ZeroReference>(new ZeroReference);
    ref->model_ = &model;
    ref->type_ = options.grad_type;
    ref->param_type_ = options.param_type;
    auto runtime = zero_runtime(nvme_dir);
    if (!runtime.ok()) return runtime.status();
    ref->runtime_ = *std::move(runtime);
    auto stream = ref->runtime_->device().create_stream();
    if (!stream.ok()) return stream.status();
    ref->stream_ = *std::move(stream);
    OffloadOptimizerOptions one_rank = options.optimizer;
    one_rank.grad_divisor = static_cast<float>(ranks);
    auto optimizer = OffloadOptimizer::create(*ref->runtime_, one_rank);
    if (!optimizer.ok()) return optimizer.status();
    ref->optimizer_ = *std::move(optimizer);
    for (size_t g = 1; g < options.groups.size(); ++g) {
      if (auto added = ref->optimizer_->add_group(options.groups[g]); !added.ok()) {
        return added.status();
      }
    }
    if (!options.groups.empty()) {
      if (auto st = ref->optimizer_->set_group(0, options.groups[0]); !st.ok()) return st;
    }
    const uint64_t pb = options.param_type == ParamType::kF32 ? 4 : 2;
    const uint64_t gb = options.grad_type == GradType::kF32 ? 4 : 2;
    TensorStore& store = ref->runtime_->store();
    for (size_t p = 0; p < model.params.size(); ++p) {
      const uint64_t n = model.initial[p].size();
      auto param = store.create(absl::StrCat("ref.", p), n * pb, TierKind::kGpu);
      auto grad = store.create(absl::StrCat("ref.", p, ".grad"), n * gb, TierKind::kGpu);
      if (!param.ok()) return param.status();
      if (!grad.ok()) return grad.status();
      ParamSpec spec;
      spec.name = model.params[p].name;
      spec.param = *param;
      spec.grad = *grad;
      spec.param_type = options.param_type;
      spec.grad_type = options.grad_type;
      spec.count = n;
      spec.group = model.params[p].group;
      spec.initial_master = model.initial[p];
      auto id = ref->optimizer_->add_param(spec);
      if (!id.ok()) return id.status();
      ref->params_.push_back(*param);
      ref->grads_.push_back(*grad);
      ref->ids_.push_back(*id);
    }
    return ref;
  }

  absl::Status micro_step(uint64_t step, uint32_t micro, uint32_t ranks, bool inf) {
    TensorStore& store = runtime_->store();
    for (int p = static_cast<int>(params_.size()) - 1; p >= 0; --p) {
      auto data = store.acquire(grads_[p], TierKind::kGpu, *stream_, AccessMode::kWrite);
      if (!data.ok()) return data.status();
      // The previous landing's copy out of this tensor may still be running.
      if (auto st = runtime_->device().synchronize(*stream_); !st.ok()) return st;
      const uint64_t n = model_->initial[p].size();
      for (uint64_t i = 0; i < n; ++i) {
        double sum = 0;
        for (uint32_t r = 0; r < ranks; ++r) {
          // Each rank's own rounding to the gradient type, as the engine's ranks see it.
          sum += load_value_of(synthetic_grad(step, micro, r, static_cast<uint32_t>(p), i));
        }
        store_value(*data, type_, i, static_cast<float>(sum));
      }
      if (inf && p == 2) store_value(*data, type_, 5, INFINITY);
      if (auto st = store.release(grads_[p], *stream_); !st.ok()) return st;
      if (auto st = optimizer_->grad_ready(ids_[p], *stream_); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<StepResult> step() { return optimizer_->step(); }
  OffloadOptimizer& optimizer() { return *optimizer_; }
  ParamId id(size_t p) const { return ids_[p]; }

  // The model's copy of parameter p, widened to fp32.
  absl::StatusOr<std::vector<float>> param(size_t p) {
    TensorStore& store = runtime_->store();
    auto data = store.acquire(params_[p], TierKind::kGpu, *stream_, AccessMode::kRead);
    if (!data.ok()) return data.status();
    if (auto st = runtime_->device().synchronize(*stream_); !st.ok()) return st;
    std::vector<float> out(model_->initial[p].size());
    for (uint64_t i = 0; i < out.size(); ++i) {
      out[i] = load_value(*data, as_grad_type(param_type_), i);
    }
    if (auto st = store.release(params_[p], *stream_); !st.ok()) return st;
    return out;
  }

 private:
  ZeroReference() = default;
  float load_value_of(float v) const {
    float out = 0;
    uint16_t half = 0;
    switch (type_) {
      case GradType::kF32:
        return v;
      case GradType::kF16:
        half = adam_detail::float_to_half(v);
        return adam_detail::half_to_float(half);
      case GradType::kBF16:
        half = adam_detail::float_to_bf16(v);
        out = adam_detail::bf16_to_float(half);
        return out;
    }
    return v;
  }

  const ZeroModel* model_ = nullptr;
  GradType type_ = GradType::kF16;
  ParamType param_type_ = ParamType::kF16;
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<OffloadOptimizer> optimizer_;
  std::vector<TensorHandle> params_;
  std::vector<TensorHandle> grads_;
  std::vector<ParamId> ids_;
};

// A parameter of the engine's model, widened to fp32 (read on the host). At stage 3 this is a
// use of its group (a collective): every rank must make it.
inline absl::StatusOr<std::vector<float>> zero_param(ZeroEngine& engine, Stream& stream,
                                                     uint32_t p) {
  const ZeroParamId id{p};
  auto data = engine.acquire_param(id, TierKind::kGpu, stream);
  if (!data.ok()) return data.status();
  if (auto st = engine.runtime().device().synchronize(stream); !st.ok()) return st;
  std::vector<float> out(engine.layout().params()[p].count);
  for (uint64_t i = 0; i < out.size(); ++i) {
    out[i] = load_value(*data, as_grad_type(engine.options().param_type), i);
  }
  if (auto st = engine.release_param(id, stream); !st.ok()) return st;
  return out;
}

}  // namespace strata::testing
