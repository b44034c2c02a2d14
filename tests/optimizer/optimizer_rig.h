// A small model trained through OffloadOptimizer on the host backend, and the same model trained
// with a plain in-memory AdamW reference: a linear layer (W, b) fitted by least squares to a
// fixed random batch, plus an "embedding" whose loss pulls it toward a target. Gradients are
// computed on the host from the parameters the model computes with (the low-precision copies),
// exactly as a GPU model would, and written into the gradient store tensors.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "optimizer/cpu_adam_kernels.h"
#include "strata/optimizer/offload_optimizer.h"
#include "strata/runtime/runtime.h"
#include "strata/testing/fault_injector.h"
#include "temp_dir.h"

namespace strata::testing {

inline float widen(uint16_t h, ParamType t) {
  return t == ParamType::kF16 ? adam_detail::half_to_float(h) : adam_detail::bf16_to_float(h);
}

// Parameter shapes: odd sizes, and one larger than several chunks.
struct Shape {
  std::string name;
  uint64_t count;
};
inline std::vector<Shape> model_shapes() {
  return {{"linear.weight", 24 * 37}, {"linear.bias", 24}, {"embed", 9001}};
}
constexpr int kIn = 37;
constexpr int kOut = 24;
constexpr int kBatch = 16;

// The data and the loss: gradients of all parameters given their current (widened) values.
struct Problem {
  std::vector<float> x, y, target;  // batch inputs, outputs, embedding target
  explicit Problem(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0F, 1.0F);
    x.resize(kBatch * kIn);
    y.resize(kBatch * kOut);
    target.resize(9001);
    for (float& v : x) v = n(rng);
    for (float& v : y) v = n(rng);
    for (float& v : target) v = n(rng);
  }
  // grads[i] for params[i]; `scale` multiplies them (loss scaling).
  std::vector<std::vector<float>> grads(const std::vector<std::vector<float>>& p,
                                        float scale) const {
    std::vector<std::vector<float>> g = {std::vector<float>(p[0].size()),
                                         std::vector<float>(p[1].size()),
                                         std::vector<float>(p[2].size())};
    for (int b = 0; b < kBatch; ++b) {
      for (int o = 0; o < kOut; ++o) {
        float out = p[1][o];
        for (int i = 0; i < kIn; ++i) out += p[0][o * kIn + i] * x[b * kIn + i];
        const float err = (out - y[b * kOut + o]) / kBatch;
        g[1][o] += err * scale;
        for (int i = 0; i < kIn; ++i) g[0][o * kIn + i] += err * x[b * kIn + i] * scale;
      }
    }
    for (size_t i = 0; i < target.size(); ++i) g[2][i] = (p[2][i] - target[i]) * 0.01F * scale;
    return g;
  }
};

// Plain AdamW in float with torch's semantics, the model's copy rounded from the master.
struct Reference {
  ParamType type;
  AdamGroup hyper;
  std::vector<std::vector<float>> master, m, v;
  uint64_t steps = 0;
  Reference(ParamType t, AdamGroup h, std::vector<std::vector<float>> init)
      : type(t), hyper(h), master(std::move(init)) {
    for (auto& p : master) {
      m.emplace_back(p.size(), 0.0F);
      v.emplace_back(p.size(), 0.0F);
    }
  }
  float round(float x) const {
    if (type == ParamType::kF32) return x;
    return type == ParamType::kF16 ? adam_detail::half_to_float(adam_detail::float_to_half(x))
                                   : adam_detail::bf16_to_float(adam_detail::float_to_bf16(x));
  }
  std::vector<std::vector<float>> model() const {
    auto out = master;
    for (auto& p : out)
      for (float& x : p) x = round(x);
    return out;
  }
  // Gradients as the optimizer sees them (already rounded to the gradient dtype).
  void step(const std::vector<std::vector<float>>& grads, float loss_scale, float max_norm) {
    double sq = 0;
    for (const auto& g : grads)
      for (float x : g) sq += static_cast<double>(x) * x;
    const double norm = std::sqrt(sq) / loss_scale;
    double coef = 1.0;
    if (max_norm > 0) coef = std::min(1.0, max_norm / (norm + 1e-6));
    const auto scale = static_cast<float>(coef / loss_scale);
    ++steps;
    const double bc1 = 1.0 - std::pow(static_cast<double>(hyper.beta1), static_cast<double>(steps));
    const double bc2 = 1.0 - std::pow(static_cast<double>(hyper.beta2), static_cast<double>(steps));
    for (size_t t = 0; t < master.size(); ++t) {
      for (size_t i = 0; i < master[t].size(); ++i) {
        float g = grads[t][i] * scale;
        float p = master[t][i];
        if (hyper.decoupled) {
          p *= 1.0F - hyper.lr * hyper.weight_decay;
        } else {
          g += hyper.weight_decay * p;
        }
        m[t][i] = hyper.beta1 * m[t][i] + (1.0F - hyper.beta1) * g;
        v[t][i] = hyper.beta2 * v[t][i] + (1.0F - hyper.beta2) * g * g;
        const double denom = std::sqrt(static_cast<double>(v[t][i])) / std::sqrt(bc2) + hyper.eps;
        p -= static_cast<float>(hyper.lr / bc1 * m[t][i] / denom);
        master[t][i] = p;
      }
    }
  }
};

struct RigOptions {
  TierKind state_home = TierKind::kCpu;
  ParamType param_type = ParamType::kF16;
  GradType grad_type = GradType::kF16;
  AdamGroup hyper = {1e-2F, 0.9F, 0.999F, 1e-8F, 0.01F, true};
  float max_grad_norm = 0.0F;
  LossScaling loss_scaling;
  uint64_t chunk_elements = 2048;  // several chunks, and chunks shared by parameters
  std::shared_ptr<FaultInjector> faults;
  std::string nvme_dir;  // required with state_home == kNvme
  OverlapOptions overlap;
  std::vector<Shape> shapes = model_shapes();  // the parameters (overlap tests vary them)
};

// A Runtime, the model's parameter and gradient tensors, and an OffloadOptimizer over them.
class Rig {
 public:
  explicit Rig(const RigOptions& o, const std::vector<std::vector<float>>& init) : options_(o) {
    std::map<std::string, std::string> vars = {
        {"STRATA_BACKEND", "host"}, {"STRATA_GPU_BYTES", "2MiB"}, {"STRATA_CPU_BYTES", "32MiB"}};
    if (!o.nvme_dir.empty()) {
      vars.insert({{"STRATA_NVME_PATHS", o.nvme_dir},
                   {"STRATA_NVME_BYTES", "64MiB"},
                   {"STRATA_IO_BLOCK", "64KiB"},
                   {"STRATA_STAGING_BYTES", "4MiB"}});
    }
    auto config = Config::from_variables(vars);
    REQUIRE(config.ok());
    RuntimeOptions runtime_options;
    runtime_options.nvme_faults = o.faults;
    auto runtime = Runtime::create(*config, std::move(runtime_options));
    REQUIRE(runtime.ok());
    runtime_ = *std::move(runtime);
    auto stream = runtime_->device().create_stream();
    REQUIRE(stream.ok());
    stream_ = *std::move(stream);
    OffloadOptimizerOptions opt;
    opt.state_home = o.state_home;
    opt.defaults = o.hyper;
    opt.max_grad_norm = o.max_grad_norm;
    opt.loss_scaling = o.loss_scaling;
    opt.chunk_elements = o.chunk_elements;
    opt.overlap = o.overlap;
    auto optimizer = OffloadOptimizer::create(*runtime_, opt);
    REQUIRE(optimizer.ok());
    optimizer_ = *std::move(optimizer);
    TensorStore& store = runtime_->store();
    const auto& shapes = o.shapes;
    const uint64_t pbytes = o.param_type == ParamType::kF32 ? 4 : 2;
    const uint64_t gbytes = o.grad_type == GradType::kF32 ? 4 : 2;
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto param = store.create(shapes[i].name, shapes[i].count * pbytes, TierKind::kCpu);
      REQUIRE(param.ok());
      auto grad = store.create(shapes[i].name + ".grad", shapes[i].count * gbytes, TierKind::kCpu);
      REQUIRE(grad.ok());
      ParamSpec spec;
      spec.name = shapes[i].name;
      spec.param = *param;
      spec.grad = *grad;
      spec.param_type = o.param_type;
      spec.grad_type = o.grad_type;
      spec.count = shapes[i].count;
      spec.initial_master = init[i];
      auto id = optimizer_->add_param(spec);
      REQUIRE(id.ok());
      params_.push_back(*param);
      grads_.push_back(*grad);
      ids_.push_back(*id);
    }
  }
  ~Rig() {
    optimizer_.reset();
    for (TensorHandle t : params_) CHECK(runtime_->store().destroy(t).ok());
    for (TensorHandle t : grads_) CHECK(runtime_->store().destroy(t).ok());
  }

  OffloadOptimizer& optimizer() { return *optimizer_; }
  Runtime& runtime() { return *runtime_; }
  Stream& stream() { return *stream_; }
  const std::vector<ParamId>& ids() const { return ids_; }

  // The parameters as the model sees them, widened.
  std::vector<std::vector<float>> model() {
    std::vector<std::vector<float>> out;
    const auto& shapes = options_.shapes;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto data =
          runtime_->store().acquire(params_[i], TierKind::kCpu, *stream_, AccessMode::kRead);
      REQUIRE(data.ok());
      std::vector<float> p(shapes[i].count);
      for (uint64_t k = 0; k < p.size(); ++k) {
        p[k] = options_.param_type == ParamType::kF32
                   ? static_cast<const float*>(*data)[k]
                   : widen(static_cast<const uint16_t*>(*data)[k], options_.param_type);
      }
      REQUIRE(runtime_->store().release(params_[i], *stream_).ok());
      out.push_back(std::move(p));
    }
    return out;
  }

  // Raw bytes of every parameter tensor, for bitwise comparisons.
  std::vector<std::vector<std::byte>> model_bytes() {
    std::vector<std::vector<std::byte>> out;
    for (TensorHandle t : params_) {
      auto info = runtime_->store().info(t);
      REQUIRE(info.ok());
      auto data = runtime_->store().acquire(t, TierKind::kCpu, *stream_, AccessMode::kRead);
      REQUIRE(data.ok());
      const auto* b = static_cast<const std::byte*>(*data);
      out.emplace_back(b, b + info->bytes);
      REQUIRE(runtime_->store().release(t, *stream_).ok());
    }
    return out;
  }

  // Writes gradients (rounded to the gradient dtype) into the GPU gradient tensors and hands
  // them to the optimizer; returns what was written, widened.
  std::vector<std::vector<float>> backward(
      const std::vector<std::vector<float>>& g,
      GradCompletion completion = GradCompletion::kOptimizerDefault) {
    std::vector<std::vector<float>> landed;
    Device& device = runtime_->device();
    for (size_t i = 0; i < grads_.size(); ++i) {
      auto data =
          runtime_->store().acquire(grads_[i], TierKind::kGpu, *stream_, AccessMode::kWrite);
      REQUIRE(data.ok());
      REQUIRE(device.synchronize(*stream_).ok());  // host backend: "GPU" memory is host memory
      std::vector<float> rounded(g[i].size());
      for (size_t k = 0; k < g[i].size(); ++k) {
        if (options_.grad_type == GradType::kF32) {
          static_cast<float*>(*data)[k] = g[i][k];
          rounded[k] = g[i][k];
        } else {
          const uint16_t h = options_.grad_type == GradType::kF16
                                 ? adam_detail::float_to_half(g[i][k])
                                 : adam_detail::float_to_bf16(g[i][k]);
          static_cast<uint16_t*>(*data)[k] = h;
          rounded[k] = options_.grad_type == GradType::kF16 ? adam_detail::half_to_float(h)
                                                            : adam_detail::bf16_to_float(h);
        }
      }
      REQUIRE(runtime_->store().release(grads_[i], *stream_).ok());
      REQUIRE(optimizer_->grad_ready(ids_[i], *stream_, completion).ok());
      landed.push_back(std::move(rounded));
    }
    return landed;
  }

  std::vector<std::vector<float>> masters() {
    std::vector<std::vector<float>> out;
    for (ParamId id : ids_) {
      std::vector<float> m(options_.shapes[id.index].count);
      REQUIRE(optimizer_->read_state(id, m, {}, {}).ok());
      out.push_back(std::move(m));
    }
    return out;
  }

 private:
  RigOptions options_;
  std::unique_ptr<Runtime> runtime_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<OffloadOptimizer> optimizer_;
  std::vector<TensorHandle> params_, grads_;
  std::vector<ParamId> ids_;
};

inline std::vector<std::vector<float>> initial_weights(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0F, 0.5F);
  std::vector<std::vector<float>> out;
  for (const Shape& s : model_shapes()) {
    std::vector<float> p(s.count);
    for (float& x : p) x = n(rng);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace strata::testing
