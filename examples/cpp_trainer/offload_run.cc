// --zero-stage=0: one rank. Each layer's parameters and gradient are a store tensor homed in the
// CPU tier, computed on through the GPU arena (smaller than the model), and stepped by an
// OffloadOptimizer whose AdamW states live on NVMe or in the CPU tier.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "strata/optimizer/offload_optimizer.h"
#include "trainer.h"

namespace cpp_trainer {
namespace {

// Destroys the tensors when the run ends (after the optimizer, declared later, is gone).
struct OwnedTensors {
  strata::TensorStore& store;
  std::vector<strata::TensorHandle> tensors;
  ~OwnedTensors() {
    for (auto t : tensors) (void)store.destroy(t);
  }
};

// The home bytes of the parameter and gradient tensors and of the optimizer's own tensors (its
// gradient landing buffer "<name>.grad.host" and, with states in the CPU tier, "<name>.master",
// ".exp_avg", ".exp_avg_sq"), from the store's record. States on NVMe are not store tensors:
// they count as what the swap space holds, as ZeroEngine::memory() counts them: two slots of
// master and moments (12 bytes an element) per chunk of the optimizer.
absl::StatusOr<ModelStateBytes> model_state_bytes(strata::TensorStore& store,
                                                  const std::vector<strata::TensorHandle>& own,
                                                  const std::vector<std::string>& names,
                                                  const strata::OffloadOptimizer& optimizer,
                                                  strata::TierKind states) {
  ModelStateBytes bytes;
  std::vector<strata::TensorHandle> tensors = own;
  std::vector<const char*> suffixes = {".grad.host"};
  if (states == strata::TierKind::kCpu) {
    suffixes.insert(suffixes.end(), {".master", ".exp_avg", ".exp_avg_sq"});
  }
  for (const std::string& name : names) {
    for (const char* suffix : suffixes) {
      auto t = store.find(absl::StrCat(name, suffix));
      if (!t.ok()) return annotate(t.status(), "the optimizer's tensors");
      tensors.push_back(*t);
    }
  }
  for (auto t : tensors) {
    auto info = store.info(t);
    if (!info.ok()) return info.status();
    bytes.by_tier[static_cast<size_t>(info->home)] += info->bytes;
  }
  if (states == strata::TierKind::kNvme) {
    bytes.by_tier[static_cast<size_t>(strata::TierKind::kNvme)] +=
        optimizer.stats().nvme_state_bytes;
  }
  return bytes;
}

// The activations one micro-step saves for backward: in memory, or (--offload-activations)
// through the stash. Layer outputs are computed into vectors and copied into the stash's GPU-tier
// buffer (host memory on the host backend, where this example computes); backward copies them
// back out, so the maths sees the same bytes either way.
class Activations {
 public:
  Activations(strata::ActivationStash* stash, strata::TierKind tier, strata::Stream& stream,
              strata::Device& device)
      : stash_(stash), tier_(tier), stream_(stream), device_(device) {}

  void begin(const std::vector<float>& input) {
    if (stash_ != nullptr) stash_->step_begin();
    saved_.assign(1, input);
    ids_.assign(1, 0);
    sizes_.assign(1, input.size() * sizeof(float));
  }
  const std::vector<float>& last() const { return saved_.back(); }

  // Layer output `y` is saved; it stays in memory too only until the next layer has read it.
  absl::Status save(std::vector<float> y) {
    if (stash_ != nullptr) {
      const uint64_t bytes = y.size() * sizeof(float);
      auto buffer = stash_->allocate(bytes, tier_, stream_);
      if (!buffer.ok()) return buffer.status();
      if (auto st = device_.synchronize(stream_); !st.ok()) return st;  // the host writes it
      std::memcpy(buffer->data, y.data(), bytes);
      if (auto st = stash_->offload(buffer->id, stream_); !st.ok()) return st;
      ids_.push_back(buffer->id);
      if (saved_.size() > 1) saved_.back() = {};  // the previous output is read: stash only
    } else {
      ids_.push_back(0);
    }
    sizes_.push_back(y.size() * sizeof(float));
    saved_.push_back(std::move(y));
    return absl::OkStatus();
  }

  // acts[k] for backward (loaded from the stash if it is not in memory).
  absl::StatusOr<const std::vector<float>*> get(int k) {
    std::vector<float>& v = saved_[static_cast<size_t>(k)];
    if (stash_ != nullptr && ids_[static_cast<size_t>(k)] != 0 && v.empty()) {
      const strata::ActivationId id = ids_[static_cast<size_t>(k)];
      auto data = stash_->load(id, stream_);
      if (!data.ok()) return data.status();
      if (auto st = device_.synchronize(stream_); !st.ok()) return st;  // the host reads it
      const auto* p = static_cast<const float*>(*data);
      v.assign(p, p + bytes_of(k) / sizeof(float));
    }
    return &v;
  }
  // acts[k] is not needed again this micro-step.
  absl::Status done(int k) {
    saved_[static_cast<size_t>(k)] = {};
    const strata::ActivationId id = ids_[static_cast<size_t>(k)];
    if (stash_ == nullptr || id == 0) return absl::OkStatus();
    ids_[static_cast<size_t>(k)] = 0;
    return stash_->free(id, stream_);
  }

 private:
  uint64_t bytes_of(int k) const { return sizes_.at(static_cast<size_t>(k)); }

  strata::ActivationStash* stash_;
  strata::TierKind tier_;
  strata::Stream& stream_;
  strata::Device& device_;
  std::vector<std::vector<float>> saved_;
  std::vector<strata::ActivationId> ids_;
  std::vector<uint64_t> sizes_;
};

std::vector<SampleRange> equal_samples(uint32_t micro_steps) {
  std::vector<SampleRange> out;
  for (uint32_t m = 0; m < micro_steps; ++m) out.push_back(samples(0, 1, m, micro_steps));
  return out;
}

}  // namespace

absl::StatusOr<RunResult> run_offload(strata::Runtime& rt, const Args& args, const Weights& init,
                                      const Weights& teacher, std::FILE* human) {
  strata::TensorStore& store = rt.store();
  strata::Device& device = rt.device();
  // The maths runs on the host: on the host backend the GPU tier is host memory.
  const strata::TierKind compute_tier = rt.config().backend == strata::Backend::kHost
                                            ? strata::TierKind::kGpu
                                            : strata::TierKind::kCpu;
  auto stream_or = device.create_stream();
  if (!stream_or.ok()) return annotate(stream_or.status(), "creating a stream");
  strata::Stream& stream = **stream_or;

  OwnedTensors owned{store, {}};
  strata::OffloadOptimizerOptions options;
  options.state_home = args.states;
  options.defaults.lr = kLr;
  options.defaults.weight_decay = kWeightDecay;
  options.overlap.enabled = args.overlap_step;
  auto optimizer_or = strata::OffloadOptimizer::create(rt, options);
  if (!optimizer_or.ok()) return optimizer_or.status();
  strata::OffloadOptimizer& optimizer = **optimizer_or;

  std::vector<strata::TensorHandle> params, grads;
  std::vector<strata::ParamId> ids;
  std::vector<std::string> names;
  uint64_t model_bytes = 0;
  for (int k = 0; k < kDepth; ++k) {
    const uint64_t n = layer_params(kLayers[k]);
    const std::string name = absl::StrFormat("layer%d", k);
    auto p = store.create(name, n * 4, strata::TierKind::kCpu);
    if (p.ok()) owned.tensors.push_back(*p);
    auto g = store.create(name + ".grad", n * 4, strata::TierKind::kCpu);
    if (g.ok()) owned.tensors.push_back(*g);
    if (!p.ok() || !g.ok()) {
      return annotate(p.ok() ? g.status() : p.status(), absl::StrCat("creating layer ", k));
    }
    strata::ParamSpec spec;
    spec.name = name;
    spec.param = *p;
    spec.grad = *g;
    spec.param_type = strata::ParamType::kF32;
    spec.grad_type = strata::GradType::kF32;
    spec.count = n;
    spec.initial_master = init[k];
    auto id = optimizer.add_param(spec);
    if (!id.ok()) return id.status();
    params.push_back(*p);
    grads.push_back(*g);
    ids.push_back(*id);
    names.push_back(name);
    model_bytes += 2 * n * 4;
  }
  if (human != nullptr) {
    std::fprintf(
        human,
        "cpp_trainer: %.1f KiB of parameters and gradients, GPU arena %.1f KiB%s, states on %s\n",
        static_cast<double>(model_bytes) / 1024, static_cast<double>(rt.gpu().capacity()) / 1024,
        arena_note(args), std::string(strata::to_string(args.states)).c_str());
    std::fflush(human);  // the header shows once training starts, also through a pipe
  }

  auto acquire = [&](strata::TensorHandle t, strata::AccessMode mode) -> absl::StatusOr<float*> {
    auto data = store.acquire(t, compute_tier, stream, mode);
    if (!data.ok()) return annotate(data.status(), "acquire");
    if (auto st = device.synchronize(stream); !st.ok()) return annotate(st, "synchronize");
    return static_cast<float*>(*data);
  };

  std::unique_ptr<strata::ActivationStash> stash;
  if (args.offload_activations) {
    strata::ActivationStashOptions o;
    o.home = args.activation_home;
    o.window_bytes = args.activation_window_bytes;
    o.prefetch_bytes = args.activation_prefetch_bytes == UINT64_MAX
                           ? args.activation_window_bytes / 2
                           : args.activation_prefetch_bytes;
    o.record_trace = !args.activation_trace.empty();
    auto made = strata::ActivationStash::create(store, device, o);
    if (!made.ok()) return annotate(made.status(), "--offload-activations");
    stash = *std::move(made);
  }
  Activations acts(stash.get(), compute_tier, stream, device);

  RunResult result;
  const float denominator = static_cast<float>(kBatch * kLayers[kDepth - 1].out);
  std::mt19937 data_rng(3);
  store.reset_peak_usage();
  const strata::OffloadOptimizerStats registered = optimizer.stats();
  for (int step = 1; step <= args.steps; ++step) {
    const std::string at = absl::StrFormat("step %d", step);
    const Batch batch = make_batch(data_rng, teacher);
    store.step_begin();
    double squared_error = 0;
    const std::vector<SampleRange> ranges = args.variable_batches
                                                ? variable_samples(step, args.accumulation)
                                                : equal_samples(args.accumulation);
    for (size_t m = 0; m < ranges.size(); ++m) {
      const SampleRange& r = ranges[m];
      // Only the last micro-step completes a gradient: with --overlap-step its Adam may start.
      const auto completion =
          m + 1 == ranges.size() ? strata::GradCompletion::kFinal : strata::GradCompletion::kMore;
      const Batch mb = ranges.size() == 1 ? batch : slice(batch, r.first, r.count);
      // The saved activations: acts[0] is the batch's input, acts[k + 1] layer k's output.
      acts.begin(mb.x);
      for (int k = 0; k < kDepth; ++k) {  // forward
        auto w = acquire(params[k], strata::AccessMode::kRead);
        if (!w.ok()) return annotate(w.status(), at);
        std::vector<float> y;
        forward_layer(kLayers[k], *w, *w + weight_count(kLayers[k]), k == kDepth - 1, r.count,
                      acts.last(), y);
        if (auto st = acts.save(std::move(y)); !st.ok()) return annotate(st, at);
        if (auto st = store.release(params[k], stream); !st.ok()) return annotate(st, at);
      }
      std::vector<float> dy;
      squared_error += squared_error_and_grad(acts.last(), mb.y, denominator, dy);
      for (int k = kDepth - 1; k >= 0; --k) {  // backward; each gradient goes at once
        auto w = acquire(params[k], strata::AccessMode::kRead);
        if (!w.ok()) return annotate(w.status(), at);
        auto g = acquire(grads[k], strata::AccessMode::kWrite);
        if (!g.ok()) return annotate(g.status(), at);
        auto x = acts.get(k);
        if (!x.ok()) return annotate(x.status(), at);
        auto y = acts.get(k + 1);
        if (!y.ok()) return annotate(y.status(), at);
        std::vector<float> dx;
        backward_layer(kLayers[k], *w, k == kDepth - 1, r.count, **x, **y, dy, *g,
                       *g + weight_count(kLayers[k]), dx);
        if (auto st = acts.done(k + 1); !st.ok()) return annotate(st, at);
        dy.swap(dx);
        if (auto st = store.release(grads[k], stream); !st.ok()) return annotate(st, at);
        if (auto st = store.release(params[k], stream); !st.ok()) return annotate(st, at);
        if (auto st = optimizer.grad_ready(ids[k], stream, completion); !st.ok()) {
          return annotate(st, at + ": grad_ready");
        }
      }
    }
    const uint64_t rollbacks = optimizer.stats().overlap_rollbacks;
    auto stepped = optimizer.step();
    if (!stepped.ok()) return annotate(stepped.status(), at + ": optimizer step");
    store.step_end();
    record_optimizer_step(optimizer.stats(), rollbacks, result);
    result.losses.push_back(static_cast<float>(squared_error / static_cast<double>(denominator)));
  }

  result.gpu_tier_peak_bytes = store.stats().tiers[0].peak_used;
  count_state_traffic(registered, optimizer.stats(), args.steps, result);
  if (stash != nullptr) {
    if (auto st = stash->synchronize(); !st.ok()) return annotate(st, "activations");
    result.activations = stash->stats();
    if (!args.activation_trace.empty()) {
      if (auto st = stash->write_trace(args.activation_trace); !st.ok()) return st;
    }
  }
  for (int k = 0; k < kDepth; ++k) {
    auto w = acquire(params[k], strata::AccessMode::kRead);
    if (!w.ok()) return annotate(w.status(), "reading the final weights");
    result.weights.emplace_back(*w, *w + layer_params(kLayers[k]));
    if (auto st = store.release(params[k], stream); !st.ok()) return st;
  }
  for (const auto& row : store.stats().moves) {
    for (const auto& m : row) result.moved_bytes += m.bytes;
  }
  result.nvme_read = optimizer.stats().nvme_bytes_read;
  result.nvme_written = optimizer.stats().nvme_bytes_written;
  auto bytes = model_state_bytes(store, owned.tensors, names, optimizer, args.states);
  if (!bytes.ok()) return bytes.status();
  result.model_states = *bytes;
  result.every_rank_moved = result.moved_bytes > 0;
  return result;
}

}  // namespace cpp_trainer
