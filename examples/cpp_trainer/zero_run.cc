// --zero-stage=1|2|3: data parallel over the ranks of the job with a ZeroEngine. Each rank takes
// its share of the global batch, adds its gradients into the engine's buffers layer by layer in
// reverse (the engine reduce-scatters each group as it completes), and the engine steps this
// rank's slice of the optimizer and (stages 1, 2) all-gathers the parameters.
//
// Stage 3: each rank holds only its shard of every weight (--param-home: gpu, cpu or nvme). The
// forward acquires each layer's parameters (the engine gathers the group, or finds it prefetched
// along the order it recorded in the first step), computes and releases them; the backward
// acquires them again, holds them while it computes the input gradient and adds the parameter
// gradients into the engine's buffers, then releases them. Every rank makes the same calls in
// the same order: they are collectives.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>

#include "strata/comm/communicator.h"
#include "strata/zero/zero_engine.h"
#include "trainer.h"

namespace cpp_trainer {
namespace {

// An all-reduce of a few host values between the ranks (the report's figures). Gloo reduces
// host memory directly; NCCL needs device memory, so the values go through a store tensor
// acquired in the GPU tier.
template <typename T>
absl::Status all_reduce(strata::Communicator& comm, strata::Runtime& rt, strata::Stream& stream,
                        std::span<T> values, strata::DataType type, strata::ReduceOp op) {
  const uint64_t bytes = values.size_bytes();
  if (comm.backend() != strata::CommBackendKind::kNccl) {
    auto work = comm.all_reduce(values.data(), values.data(), values.size(), type, op);
    if (!work.ok()) return work.status();
    return (*work)->wait();
  }
  strata::TensorStore& store = rt.store();
  auto t = store.create("cpp_trainer.all_reduce", bytes, strata::TierKind::kCpu);
  if (!t.ok()) return t.status();
  auto run = [&]() -> absl::Status {
    auto host = store.acquire(*t, strata::TierKind::kCpu, stream, strata::AccessMode::kWrite);
    if (!host.ok()) return host.status();
    if (auto st = rt.device().synchronize(stream); !st.ok()) return st;
    std::memcpy(*host, values.data(), bytes);
    if (auto st = store.release(*t, stream); !st.ok()) return st;
    auto dev = store.acquire(*t, strata::TierKind::kGpu, stream, strata::AccessMode::kWrite);
    if (!dev.ok()) return dev.status();
    auto work = comm.all_reduce(*dev, *dev, values.size(), type, op, {.stream = &stream});
    if (!work.ok()) return work.status();
    if (auto st = (*work)->synchronize(); !st.ok()) return st;
    if (auto st = store.release(*t, stream); !st.ok()) return st;
    host = store.acquire(*t, strata::TierKind::kCpu, stream, strata::AccessMode::kRead);
    if (!host.ok()) return host.status();
    if (auto st = rt.device().synchronize(stream); !st.ok()) return st;
    std::memcpy(values.data(), *host, bytes);
    return store.release(*t, stream);
  };
  absl::Status st = run();
  (void)store.destroy(*t);
  return st;
}

// The engine's parameters: each layer's weight (out x in) and bias (out), in forward order.
struct ZeroModel {
  std::vector<strata::ZeroParam> params;
  std::vector<strata::ZeroParamId> weight, bias;  // per layer
};

std::vector<strata::ZeroParam> zero_params(const Weights& init) {
  std::vector<strata::ZeroParam> params;
  for (int k = 0; k < kDepth; ++k) {
    const Layer& l = kLayers[k];
    const std::span<const float> all(init[k]);
    strata::ZeroParam w;
    w.name = absl::StrFormat("layer%d.weight", k);
    w.shape = {l.out, l.in};
    w.initial = all.first(weight_count(l));
    strata::ZeroParam b;
    b.name = absl::StrFormat("layer%d.bias", k);
    b.shape = {l.out};
    b.initial = all.subspan(weight_count(l));
    params.push_back(std::move(w));
    params.push_back(std::move(b));
  }
  return params;
}

// What the engine is given: fp32 parameters and gradients (the maths is fp32, as the
// reference's), homed in the CPU tier at stages 1 and 2 and computed on through the GPU arena, as
// at stage 0; stage 3 homes the shards in --param-home.
strata::ZeroOptions zero_options(const Args& args) {
  strata::ZeroOptions options;
  options.stage = args.zero_stage;
  options.param_type = strata::ParamType::kF32;
  options.grad_type = strata::GradType::kF32;
  options.bucket_bytes = args.bucket_bytes;
  options.accumulation_steps = args.accumulation;
  options.param_home = args.zero_stage == 3 ? args.param_home : strata::TierKind::kCpu;
  options.prefetch_bytes = args.prefetch_bytes;
  options.max_live_bytes = args.max_live_bytes;
  options.persist_below_bytes = args.persist_below_bytes;
  options.reuse_window_bytes = args.reuse_window_bytes;
  options.hpz_node_ranks = args.hpz_node_ranks;
  options.optimizer.state_home = args.states;
  options.optimizer.defaults.lr = kLr;
  options.optimizer.defaults.weight_decay = kWeightDecay;
  // The engine tells its optimizer which micro-step completes a gradient (accumulation_steps).
  options.optimizer.overlap.enabled = args.overlap_step;
  return options;
}

}  // namespace

absl::StatusOr<LargestGather> largest_gather(const Args& args, int ranks) {
  // The engine's planning (ZeroEngine::create): parameters below the threshold are persistent,
  // groups of at most bucket_bytes of gradients, padded to ranks x alignment elements.
  const strata::ZeroOptions o = zero_options(args);
  std::vector<strata::ZeroLayoutParam> lp;
  const Weights init = random_weights(1);
  for (const strata::ZeroParam& p : zero_params(init)) {
    strata::ZeroLayoutParam l;
    l.name = p.name;
    l.shape = p.shape;
    l.persistent = o.stage == 3 && p.initial.size_bytes() < o.persist_below_bytes;
    lp.push_back(std::move(l));
  }
  auto layout =
      strata::ZeroLayout::plan(std::move(lp), static_cast<uint32_t>(ranks),
                               std::max<uint64_t>(1, o.bucket_bytes / sizeof(float)), o.alignment);
  if (!layout.ok()) return layout.status();
  LargestGather largest;
  for (uint32_t g = 0; g < layout->groups().size(); ++g) {
    const strata::ZeroFlatGroup& fg = layout->groups()[g];
    if (fg.persistent || fg.padded * sizeof(float) <= largest.bytes) continue;
    largest.bytes = fg.padded * sizeof(float);
    largest.first_param = layout->params()[layout->group_segments(g).front().param].name;
  }
  return largest;
}

absl::StatusOr<RunResult> run_zero(strata::Runtime& rt, const Args& args, const Weights& init,
                                   const Weights& teacher, std::FILE* human) {
  strata::Device& device = rt.device();
  const strata::TierKind compute_tier = rt.config().backend == strata::Backend::kHost
                                            ? strata::TierKind::kGpu
                                            : strata::TierKind::kCpu;
  auto stream_or = device.create_stream();
  if (!stream_or.ok()) return annotate(stream_or.status(), "creating a stream");
  strata::Stream& stream = **stream_or;

  auto comm_or = strata::Communicator::from_environment(&device);
  if (!comm_or.ok()) return annotate(comm_or.status(), "joining the job");
  strata::Communicator& comm = **comm_or;
  const int rank = comm.rank();
  const int ranks = comm.size();
  if (rank != 0) human = nullptr;

  const strata::ZeroOptions options = zero_options(args);
  const std::vector<strata::ZeroParam> params = zero_params(init);
  auto engine_or = strata::ZeroEngine::create(rt, comm, params, options);
  if (!engine_or.ok()) return annotate(engine_or.status(), "creating the ZeRO engine");
  strata::ZeroEngine& engine = **engine_or;
  ZeroModel model;
  for (int k = 0; k < kDepth; ++k) {
    auto w = engine.find(params[2 * k].name);
    if (!w.ok()) return w.status();
    auto b = engine.find(params[2 * k + 1].name);
    if (!b.ok()) return b.status();
    model.weight.push_back(*w);
    model.bias.push_back(*b);
  }
  const strata::ZeroLayout& layout = engine.layout();
  const bool stage3 = args.zero_stage == 3;
  uint64_t partitioned_groups = 0;
  for (const strata::ZeroFlatGroup& g : layout.groups()) {
    partitioned_groups += stage3 && !g.persistent ? 1 : 0;
  }
  if (human != nullptr) {
    std::fprintf(
        human,
        "cpp_trainer: ZeRO stage %u on %d rank(s) (%s), %.1f KiB of parameters in %zu "
        "groups (of at most %.1f KiB, or one larger parameter), GPU arena %.1f KiB%s, states on "
        "%s\n",
        args.zero_stage, ranks, std::string(strata::to_string(comm.backend())).c_str(),
        static_cast<double>(layout.elements() * 4) / 1024, layout.groups().size(),
        static_cast<double>(args.bucket_bytes) / 1024,
        static_cast<double>(rt.gpu().capacity()) / 1024, arena_note(args),
        std::string(strata::to_string(args.states)).c_str());
    if (stage3) {
      std::fprintf(human,
                   "stage 3: %llu groups partitioned, shards on %s; %zu whole on every rank "
                   "(below %llu bytes); prefetch %.1f KiB ahead, at most %.1f KiB gathered, "
                   "kept for reuse within %.1f KiB\n",
                   static_cast<unsigned long long>(partitioned_groups),
                   std::string(strata::to_string(args.param_home)).c_str(),
                   layout.groups().size() - partitioned_groups,
                   static_cast<unsigned long long>(args.persist_below_bytes),
                   static_cast<double>(args.prefetch_bytes) / 1024,
                   static_cast<double>(args.max_live_bytes) / 1024,
                   static_cast<double>(args.reuse_window_bytes) / 1024);
    }
    std::fflush(human);  // the header shows once training starts, also through a pipe
  }

  // The host's waits for the gathers: acquire_param() returns with the gather ordered on the
  // stream, and the host reads the parameters after synchronizing it (stage 3).
  uint64_t gather_wait_ns = 0;
  auto acquire_param = [&](strata::ZeroParamId id) -> absl::StatusOr<const float*> {
    auto data = engine.acquire_param(id, compute_tier, stream);
    if (!data.ok() && stage3 && data.status().code() == absl::StatusCode::kResourceExhausted) {
      // The engine names its options; the trainer's are the flags.
      return absl::Status(data.status().code(),
                          absl::StrCat("acquire_param: ", data.status().message(),
                                       " (here: --max-live-bytes, --prefetch-bytes or "
                                       "STRATA_GPU_BYTES; this model wants a 2MiB arena with "
                                       "the defaults)"));
    }
    if (!data.ok()) return annotate(data.status(), "acquire_param");
    const absl::Time start = absl::Now();
    if (auto st = device.synchronize(stream); !st.ok()) return annotate(st, "synchronize");
    if (stage3)
      gather_wait_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
    return static_cast<const float*>(*data);
  };
  // Adds `g` into the parameter's gradient buffer and announces it.
  auto add_grad = [&](strata::ZeroParamId id, const std::vector<float>& g) -> absl::Status {
    auto data = engine.acquire_grad(id, compute_tier, stream);
    if (!data.ok()) return annotate(data.status(), "acquire_grad");
    if (auto st = device.synchronize(stream); !st.ok()) return annotate(st, "synchronize");
    float* out = static_cast<float*>(*data);
    for (size_t i = 0; i < g.size(); ++i) out[i] += g[i];
    return annotate(engine.grad_ready(id, stream), "grad_ready");
  };

  // Each rank's gradient is its samples' share of the global mean times the rank count: the
  // engine's reduction averages over the ranks (sum / N), which then is the global-batch mean.
  const double outputs = static_cast<double>(kBatch) * kLayers[kDepth - 1].out;
  const float denominator = static_cast<float>(outputs / ranks);
  RunResult result;
  std::vector<double> squared_errors;  // this rank's, per step
  uint64_t step_wait_ns = 0;           // step() waiting for reduce-scatters, summed
  std::mt19937 data_rng(3);
  strata::TensorStore& store = rt.store();
  const strata::OffloadOptimizerStats registered = engine.optimizer().stats();
  store.reset_peak_usage();
  for (int step = 1; step <= args.steps; ++step) {
    const std::string at = absl::StrFormat("step %d", step);
    const Batch batch = make_batch(data_rng, teacher);
    store.step_begin();
    double squared_error = 0;
    for (uint32_t micro = 0; micro < args.accumulation; ++micro) {
      const SampleRange r = samples(rank, ranks, micro, args.accumulation);
      const Batch mb = slice(batch, r.first, r.count);
      std::vector<std::vector<float>> acts = {mb.x};
      for (int k = 0; k < kDepth; ++k) {  // forward
        auto w = acquire_param(model.weight[k]);
        if (!w.ok()) return annotate(w.status(), at);
        auto b = acquire_param(model.bias[k]);
        if (!b.ok()) return annotate(b.status(), at);
        std::vector<float> y;
        forward_layer(kLayers[k], *w, *b, k == kDepth - 1, r.count, acts.back(), y);
        acts.push_back(std::move(y));
        for (auto id : {model.bias[k], model.weight[k]}) {
          if (auto st = engine.release_param(id, stream); !st.ok()) return annotate(st, at);
        }
      }
      std::vector<float> dy;
      squared_error += squared_error_and_grad(acts.back(), mb.y, denominator, dy);
      for (int k = kDepth - 1; k >= 0; --k) {  // backward; each gradient goes at once
        const Layer& l = kLayers[k];
        auto w = acquire_param(model.weight[k]);
        if (!w.ok()) return annotate(w.status(), at);
        // Stage 3 holds the layer's parameters across its gradients, as autograd holds a
        // module's: the bias too (the order of uses is the engine's fetch schedule). Stages 1
        // and 2 let the weight go first: the arena then holds both gradient buckets.
        if (stage3) {
          if (auto b = acquire_param(model.bias[k]); !b.ok()) return annotate(b.status(), at);
        }
        std::vector<float> gw(weight_count(l)), gb(static_cast<size_t>(l.out)), dx;
        backward_layer(l, *w, k == kDepth - 1, r.count, acts[k], acts[k + 1], dy, gw.data(),
                       gb.data(), dx);
        dy.swap(dx);
        if (!stage3) {
          if (auto st = engine.release_param(model.weight[k], stream); !st.ok()) {
            return annotate(st, at);
          }
        }
        if (auto st = add_grad(model.weight[k], gw); !st.ok()) return annotate(st, at);
        if (auto st = add_grad(model.bias[k], gb); !st.ok()) return annotate(st, at);
        if (stage3) {
          for (auto id : {model.bias[k], model.weight[k]}) {
            if (auto st = engine.release_param(id, stream); !st.ok()) return annotate(st, at);
          }
        }
      }
    }
    const uint64_t rollbacks = engine.optimizer().stats().overlap_rollbacks;
    auto stepped = engine.step();
    if (!stepped.ok()) return annotate(stepped.status(), at + ": engine step");
    store.step_end();
    record_optimizer_step(engine.optimizer().stats(), rollbacks, result);
    squared_errors.push_back(squared_error / outputs);
    step_wait_ns += engine.stats().last_step_wait_ns;
  }

  // The report's figures, read before the collectives below add to the communicator's count.
  result.rank = rank;
  result.ranks = ranks;
  const strata::ZeroStats stats = engine.stats();
  result.comm_bytes_per_step = stats.last_step_comm_bytes;
  result.zero_stats = stats;
  result.exposed_comm_ns =
      gather_wait_ns + stats.fetch_wait_ns + stats.bucket_wait_ns + step_wait_ns;
  result.partitioned_groups = partitioned_groups;
  const strata::ZeroMemory memory = engine.memory();
  for (size_t t = 0; t < 3; ++t) {
    result.model_states.by_tier[t] =
        memory.params[t] + memory.grads[t] + memory.optimizer_states[t];
    result.bucket_memory += memory.buckets[t];
  }
  result.groups = layout.groups().size();
  result.nvme_read = engine.optimizer().stats().nvme_bytes_read;
  result.nvme_written = engine.optimizer().stats().nvme_bytes_written;
  count_state_traffic(registered, engine.optimizer().stats(), args.steps, result);
  result.gpu_tier_peak_bytes = store.stats().tiers[0].peak_used;
  for (const auto& row : store.stats().moves) {
    for (const auto& m : row) result.moved_bytes += m.bytes;
  }

  std::vector<float> mine;  // this rank's final weights, all layers
  for (int k = 0; k < kDepth; ++k) {
    std::vector<float> layer;
    for (auto id : {model.weight[k], model.bias[k]}) {
      auto p = acquire_param(id);
      if (!p.ok()) return annotate(p.status(), "reading the final weights");
      const uint64_t n = id == model.weight[k] ? weight_count(kLayers[k]) : kLayers[k].out;
      layer.insert(layer.end(), *p, *p + n);
      if (auto st = engine.release_param(id, stream); !st.ok()) return st;
    }
    mine.insert(mine.end(), layer.begin(), layer.end());
    result.weights.push_back(std::move(layer));
  }

  // Every rank's losses summed: the global batch's mean loss per step.
  if (auto st = all_reduce(comm, rt, stream, std::span(squared_errors), strata::DataType::kFloat64,
                           strata::ReduceOp::kSum);
      !st.ok()) {
    return annotate(st, "summing the losses");
  }
  for (double e : squared_errors) result.losses.push_back(static_cast<float>(e));
  // The ranks' copies of the weights: the element-wise max and min over the ranks.
  std::vector<float> hi = mine, lo = mine;
  for (auto [v, op] : {std::pair{&hi, strata::ReduceOp::kMax}, {&lo, strata::ReduceOp::kMin}}) {
    if (auto st = all_reduce(comm, rt, stream, std::span(*v), strata::DataType::kFloat32, op);
        !st.ok()) {
      return annotate(st, "comparing the ranks' weights");
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    result.replica_difference =
        std::max(result.replica_difference, static_cast<double>(hi[i]) - lo[i]);
  }
  double moved = result.moved_bytes > 0 ? 1 : 0;
  if (auto st = all_reduce(comm, rt, stream, std::span(&moved, 1), strata::DataType::kFloat64,
                           strata::ReduceOp::kMin);
      !st.ok()) {
    return annotate(st, "counting the moves");
  }
  result.every_rank_moved = moved > 0;
  return result;
}

}  // namespace cpp_trainer
