// cpp_trainer: a small MLP regression trained in C++ with its parameters, gradients and
// optimizer states managed by strata, checked against the same MLP trained all in memory.
//
// The model (16 -> 256 -> 256 -> 256 -> 4, tanh) learns a fixed random "teacher" MLP. Its
// parameters and gradients are store tensors homed in the CPU tier; the GPU arena
// (STRATA_GPU_BYTES) is set smaller than parameters plus gradients, so every step moves them. The
// AdamW states live on NVMe (--states=nvme, the default; needs STRATA_NVME_PATHS) or in the CPU
// tier. The maths runs on the host: with the host backend the GPU tier is host memory, which is
// what CI has. (With the CUDA backend a real trainer launches kernels on the acquired pointers;
// this example then computes on CPU-tier copies instead, so it still runs.)
//
// Exit status: 0 when the loss fell below --max-loss and the weights match the in-memory run
// within --tolerance; 1 otherwise; 2 on a usage error.
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "strata/offload/offload_optimizer.h"
#include "strata/runtime/runtime.h"

namespace {

struct Layer {
  int in, out;
};
constexpr Layer kLayers[] = {{16, 256}, {256, 256}, {256, 256}, {256, 4}};
constexpr int kDepth = static_cast<int>(std::size(kLayers));
constexpr int kBatch = 64;

// One layer's weights and bias, flat: W is out x in, then b.
uint64_t layer_params(const Layer& l) { return static_cast<uint64_t>(l.in) * l.out + l.out; }

using Weights = std::vector<std::vector<float>>;  // per layer

Weights random_weights(uint32_t seed) {
  std::mt19937 rng(seed);
  Weights w;
  for (const Layer& l : kLayers) {
    std::normal_distribution<float> n(0.0F, 1.0F / std::sqrt(static_cast<float>(l.in)));
    std::vector<float> p(layer_params(l));
    for (float& x : p) x = n(rng);
    std::fill(p.end() - l.out, p.end(), 0.0F);
    w.push_back(std::move(p));
  }
  return w;
}

// Forward through one layer: y = W x + b, tanh except on the last layer.
void forward_layer(const Layer& l, const float* p, bool last, const std::vector<float>& x,
                   std::vector<float>& y) {
  y.assign(static_cast<size_t>(kBatch) * l.out, 0.0F);
  const float* b = p + static_cast<size_t>(l.in) * l.out;
  for (int s = 0; s < kBatch; ++s) {
    for (int o = 0; o < l.out; ++o) {
      float acc = b[o];
      const float* row = p + static_cast<size_t>(o) * l.in;
      for (int i = 0; i < l.in; ++i) acc += row[i] * x[static_cast<size_t>(s) * l.in + i];
      y[static_cast<size_t>(s) * l.out + o] = last ? acc : std::tanh(acc);
    }
  }
}

// Given dL/dy (after the activation), fills the layer's gradient and dL/dx.
void backward_layer(const Layer& l, const float* p, bool last, const std::vector<float>& x,
                    const std::vector<float>& y, std::vector<float> dy, float* grad,
                    std::vector<float>& dx) {
  if (!last) {
    for (size_t k = 0; k < dy.size(); ++k) dy[k] *= 1.0F - y[k] * y[k];
  }
  std::fill(grad, grad + layer_params(l), 0.0F);
  float* gb = grad + static_cast<size_t>(l.in) * l.out;
  dx.assign(static_cast<size_t>(kBatch) * l.in, 0.0F);
  for (int s = 0; s < kBatch; ++s) {
    for (int o = 0; o < l.out; ++o) {
      const float d = dy[static_cast<size_t>(s) * l.out + o];
      gb[o] += d;
      const float* row = p + static_cast<size_t>(o) * l.in;
      float* grow = grad + static_cast<size_t>(o) * l.in;
      for (int i = 0; i < l.in; ++i) {
        grow[i] += d * x[static_cast<size_t>(s) * l.in + i];
        dx[static_cast<size_t>(s) * l.in + i] += d * row[i];
      }
    }
  }
}

// A batch: inputs and the teacher's outputs.
struct Batch {
  std::vector<float> x, y;
};

Batch make_batch(std::mt19937& rng, const Weights& teacher) {
  std::normal_distribution<float> n(0.0F, 1.0F);
  Batch b;
  b.x.resize(static_cast<size_t>(kBatch) * kLayers[0].in);
  for (float& v : b.x) v = n(rng);
  std::vector<float> act = b.x, next;
  for (int k = 0; k < kDepth; ++k) {
    forward_layer(kLayers[k], teacher[k].data(), k == kDepth - 1, act, next);
    act.swap(next);
  }
  b.y = act;
  return b;
}

// Loss (mean squared error) and dL/dout.
float loss_and_grad(const std::vector<float>& out, const std::vector<float>& y,
                    std::vector<float>& dout) {
  dout.resize(out.size());
  double loss = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    const float e = out[k] - y[k];
    loss += static_cast<double>(e) * e;
    dout[k] = 2.0F * e / static_cast<float>(out.size());
  }
  return static_cast<float>(loss / static_cast<double>(out.size()));
}

// The all-in-memory reference: the same model and the same AdamW (torch semantics).
struct InMemory {
  Weights w, m, v;
  float lr, wd;
  uint64_t t = 0;
  InMemory(Weights init, float lr_, float wd_) : w(std::move(init)), lr(lr_), wd(wd_) {
    for (auto& p : w) {
      m.emplace_back(p.size(), 0.0F);
      v.emplace_back(p.size(), 0.0F);
    }
  }
  float step(const Batch& b) {
    std::vector<std::vector<float>> acts = {b.x};
    for (int k = 0; k < kDepth; ++k) {
      std::vector<float> y;
      forward_layer(kLayers[k], w[k].data(), k == kDepth - 1, acts.back(), y);
      acts.push_back(std::move(y));
    }
    std::vector<float> dy;
    const float loss = loss_and_grad(acts.back(), b.y, dy);
    ++t;
    const double bc1 = 1 - std::pow(0.9, static_cast<double>(t));
    const double bc2 = 1 - std::pow(0.999, static_cast<double>(t));
    for (int k = kDepth - 1; k >= 0; --k) {
      std::vector<float> g(layer_params(kLayers[k])), dx;
      backward_layer(kLayers[k], w[k].data(), k == kDepth - 1, acts[k], acts[k + 1], dy, g.data(),
                     dx);
      for (size_t i = 0; i < g.size(); ++i) {
        float p = w[k][i] * (1.0F - lr * wd);
        m[k][i] = 0.9F * m[k][i] + 0.1F * g[i];
        v[k][i] = 0.999F * v[k][i] + 0.001F * g[i] * g[i];
        const double denom = std::sqrt(static_cast<double>(v[k][i])) / std::sqrt(bc2) + 1e-8;
        w[k][i] = p - static_cast<float>(lr / bc1 * m[k][i] / denom);
      }
      dy.swap(dx);
    }
    return loss;
  }
};

struct Args {
  int steps = 300;
  strata::TierKind states = strata::TierKind::kNvme;
  float max_loss = 0.05F;
  double tolerance = 1e-3;
};

int usage(const std::string& why) {
  std::fprintf(stderr,
               "cpp_trainer: %s\nusage: cpp_trainer [--steps=N] [--states=nvme|cpu] "
               "[--max-loss=X] [--tolerance=X]\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = a.substr(a.find('=') + 1);
    char* end = nullptr;
    if (a.starts_with("--steps=")) {
      args.steps = static_cast<int>(std::strtol(value.c_str(), &end, 10));
      if (*end != '\0' || args.steps <= 0) return usage("--steps wants a positive integer");
    } else if (a == "--states=nvme" || a == "--states=cpu") {
      args.states = a == "--states=cpu" ? strata::TierKind::kCpu : strata::TierKind::kNvme;
    } else if (a.starts_with("--max-loss=")) {
      args.max_loss = std::strtof(value.c_str(), &end);
      if (*end != '\0' || !(args.max_loss > 0)) return usage("--max-loss wants a number > 0");
    } else if (a.starts_with("--tolerance=")) {
      args.tolerance = std::strtod(value.c_str(), &end);
      if (*end != '\0' || !(args.tolerance > 0)) return usage("--tolerance wants a number > 0");
    } else {
      return usage("unknown argument '" + a + "'");
    }
  }

  auto runtime = strata::Runtime::from_environment();
  if (!runtime.ok()) {
    std::fprintf(stderr, "cpp_trainer: %s\n", std::string(runtime.status().message()).c_str());
    return 1;
  }
  strata::Runtime& rt = **runtime;
  strata::TensorStore& store = rt.store();
  strata::Device& device = rt.device();
  // The maths runs on the host: on the host backend the GPU tier is host memory.
  const strata::TierKind compute_tier = rt.config().backend == strata::Backend::kHost
                                            ? strata::TierKind::kGpu
                                            : strata::TierKind::kCpu;
  auto stream_or = device.create_stream();
  if (!stream_or.ok()) return 1;
  strata::Stream& stream = **stream_or;

  constexpr float kLr = 2e-3F;
  constexpr float kWeightDecay = 1e-4F;
  strata::OffloadOptimizerOptions options;
  options.state_home = args.states;
  options.defaults.lr = kLr;
  options.defaults.weight_decay = kWeightDecay;
  auto optimizer_or = strata::OffloadOptimizer::create(rt, options);
  if (!optimizer_or.ok()) {
    std::fprintf(stderr, "cpp_trainer: %s\n", std::string(optimizer_or.status().message()).c_str());
    return 1;
  }
  strata::OffloadOptimizer& optimizer = **optimizer_or;

  const Weights init = random_weights(1);
  const Weights teacher = random_weights(2);
  std::vector<strata::TensorHandle> params, grads;
  std::vector<strata::ParamId> ids;
  uint64_t model_bytes = 0;
  for (int k = 0; k < kDepth; ++k) {
    const uint64_t n = layer_params(kLayers[k]);
    auto p = store.create(absl::StrFormat("layer%d", k), n * 4, strata::TierKind::kCpu);
    auto g = store.create(absl::StrFormat("layer%d.grad", k), n * 4, strata::TierKind::kCpu);
    if (!p.ok() || !g.ok()) {
      std::fprintf(stderr, "cpp_trainer: creating layer %d: %s\n", k,
                   std::string((p.ok() ? g.status() : p.status()).message()).c_str());
      return 1;
    }
    strata::ParamSpec spec;
    spec.name = absl::StrFormat("layer%d", k);
    spec.param = *p;
    spec.grad = *g;
    spec.param_type = strata::ParamType::kF32;
    spec.grad_type = strata::GradType::kF32;
    spec.count = n;
    spec.initial_master = init[k];
    auto id = optimizer.add_param(spec);
    if (!id.ok()) {
      std::fprintf(stderr, "cpp_trainer: %s\n", std::string(id.status().message()).c_str());
      return 1;
    }
    params.push_back(*p);
    grads.push_back(*g);
    ids.push_back(*id);
    model_bytes += 2 * n * 4;
  }
  std::printf(
      "cpp_trainer: %.1f KiB of parameters and gradients, GPU arena %.1f KiB, states on %s\n",
      static_cast<double>(model_bytes) / 1024, static_cast<double>(rt.gpu().capacity()) / 1024,
      std::string(strata::to_string(args.states)).c_str());

  // Acquire/compute/release helpers; every error ends the run with the runtime's message.
  bool failed = false;
  auto check = [&](const absl::Status& st, const char* what) {
    if (!st.ok() && !failed) {
      std::fprintf(stderr, "cpp_trainer: %s: %s\n", what, std::string(st.message()).c_str());
      failed = true;
    }
    return st.ok();
  };
  auto acquire = [&](strata::TensorHandle t, strata::AccessMode mode) -> float* {
    auto data = store.acquire(t, compute_tier, stream, mode);
    if (!check(data.status(), "acquire")) return nullptr;
    if (!check(device.synchronize(stream), "synchronize")) return nullptr;
    return static_cast<float*>(*data);
  };

  InMemory reference(init, kLr, kWeightDecay);
  std::mt19937 data_rng(3), reference_rng(3);
  float loss = 0, reference_loss = 0;
  for (int step = 1; step <= args.steps && !failed; ++step) {
    const Batch batch = make_batch(data_rng, teacher);
    store.step_begin();
    std::vector<std::vector<float>> acts = {batch.x};
    for (int k = 0; k < kDepth && !failed; ++k) {  // forward
      const float* w = acquire(params[k], strata::AccessMode::kRead);
      if (w == nullptr) break;
      std::vector<float> y;
      forward_layer(kLayers[k], w, k == kDepth - 1, acts.back(), y);
      acts.push_back(std::move(y));
      check(store.release(params[k], stream), "release");
    }
    if (failed) break;
    std::vector<float> dy;
    loss = loss_and_grad(acts.back(), batch.y, dy);
    for (int k = kDepth - 1; k >= 0 && !failed; --k) {  // backward; each gradient goes at once
      const float* w = acquire(params[k], strata::AccessMode::kRead);
      float* g = w == nullptr ? nullptr : acquire(grads[k], strata::AccessMode::kWrite);
      if (g == nullptr) break;
      std::vector<float> dx;
      backward_layer(kLayers[k], w, k == kDepth - 1, acts[k], acts[k + 1], dy, g, dx);
      dy.swap(dx);
      check(store.release(grads[k], stream), "release");
      check(store.release(params[k], stream), "release");
      check(optimizer.grad_ready(ids[k], stream), "grad_ready");
    }
    if (failed) break;
    auto result = optimizer.step();
    if (!check(result.status(), "step")) break;
    store.step_end();
    reference_loss = reference.step(make_batch(reference_rng, teacher));
    if (step % 50 == 0 || step == 1) {
      std::printf("step %4d  loss %.6f  (in memory %.6f)\n", step, loss, reference_loss);
    }
  }
  if (failed) return 1;

  double worst = 0;
  for (int k = 0; k < kDepth; ++k) {
    const float* w = acquire(params[k], strata::AccessMode::kRead);
    if (w == nullptr) return 1;
    for (size_t i = 0; i < reference.w[k].size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(w[i]) - reference.w[k][i]) /
                                  std::max(1.0, std::fabs(static_cast<double>(reference.w[k][i]))));
    }
    if (!check(store.release(params[k], stream), "release")) return 1;
  }
  const strata::StoreStats stats = store.stats();
  const auto& moves = stats.moves;
  uint64_t moved = 0;
  for (const auto& row : moves)
    for (const auto& m : row) moved += m.bytes;
  std::printf("final loss %.6f (threshold %.4f), in-memory run %.6f\n", loss, args.max_loss,
              reference_loss);
  std::printf("largest weight difference to the in-memory run: %.3g (tolerance %.3g)\n", worst,
              args.tolerance);
  std::printf(
      "bytes moved between tiers: %.1f MiB; optimizer NVMe read %.1f MiB, written %.1f MiB\n",
      static_cast<double>(moved) / (1 << 20),
      static_cast<double>(optimizer.stats().nvme_bytes_read) / (1 << 20),
      static_cast<double>(optimizer.stats().nvme_bytes_written) / (1 << 20));
  const bool ok = loss < args.max_loss && worst < args.tolerance && moved > 0;
  if (moved == 0) std::printf("no tensor moved: the GPU arena is not smaller than the model\n");
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  optimizer_or->reset();
  for (auto t : params) (void)store.destroy(t);
  for (auto t : grads) (void)store.destroy(t);
  return ok ? 0 : 1;
}
