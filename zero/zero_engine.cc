// ZeroEngine: creation (layout, flat tensors, the optimizer of this rank's slices), parameter
// access, and step() — statistics combined over the ranks, the optimizer on the own slices,
// the in-place all-gather of the parameters.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cstring>

#include "strata/base/mutex.h"
#include "zero_engine_impl.h"

namespace strata {
namespace {

uint64_t since_ns(absl::Time start) {
  return static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
}

absl::Status invalid(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("ZeroEngine: ", std::string(what)));
}

}  // namespace

DataType comm_type(ParamType type) {
  switch (type) {
    case ParamType::kF32:
      return DataType::kFloat32;
    case ParamType::kF16:
      return DataType::kFloat16;
    case ParamType::kBF16:
      return DataType::kBFloat16;
  }
  return DataType::kFloat32;
}

DataType comm_type(GradType type) {
  switch (type) {
    case GradType::kF32:
      return DataType::kFloat32;
    case GradType::kF16:
      return DataType::kFloat16;
    case GradType::kBF16:
      return DataType::kBFloat16;
  }
  return DataType::kFloat32;
}

uint64_t ZeroMemory::model_states() const {
  uint64_t total = 0;
  for (size_t t = 0; t < 3; ++t) total += params[t] + grads[t] + optimizer_states[t];
  return total;
}

absl::Status ZeroEngine::Impl::failure() const {
  MutexLock lock(&mu);
  return failed;
}

absl::Status ZeroEngine::Impl::fail(absl::Status status) {
  MutexLock lock(&mu);
  if (failed.ok()) failed = status;
  changed.SignalAll();
  return status;
}

absl::Status ZeroEngine::Impl::check_param(ZeroParamId id) const {
  if (id.index >= layout.params().size()) {
    return absl::NotFoundError(absl::StrFormat("ZeroEngine: no parameter with id %d (%d exist)",
                                               id.index, layout.params().size()));
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::Impl::zero_tensor(TensorHandle tensor, uint64_t bytes) {
  TensorStore& store = runtime.store();
  auto data = store.acquire(tensor, host_tier, *host_stream, AccessMode::kWrite);
  if (!data.ok()) return data.status();
  // The host writes: a copy into this tier (a fetch) must not land on top of the zeros.
  if (auto st = runtime.device().synchronize(*host_stream); !st.ok()) {
    (void)store.release(tensor, *host_stream);
    return st;
  }
  std::memset(*data, 0, bytes);
  return store.release(tensor, *host_stream);
}

absl::StatusOr<std::unique_ptr<ZeroEngine>> ZeroEngine::create(Runtime& runtime, Communicator& comm,
                                                               std::span<const ZeroParam> params,
                                                               ZeroOptions options) {
  if (options.stage < 1 || options.stage > 3) {
    return invalid(absl::StrFormat(
        "stage %d is not a ZeRO stage; use 1 (optimizer states partitioned), 2 (gradients too) "
        "or 3 (parameters too)",
        options.stage));
  }
  if (options.accumulation_steps == 0) return invalid("accumulation_steps is 0; use 1 or more");
  if (options.gradient_buckets == 0) return invalid("gradient_buckets is 0; use 1 or more");
  if (options.alignment == 0) return invalid("alignment is 0; use 1 or more elements");
  if (options.param_home == TierKind::kNvme && options.stage != 3) {
    return invalid(
        "param_home is the NVMe tier; at stages 1 and 2 the model's parameters live in gpu or "
        "cpu (stage 3 homes each rank's shard anywhere)");
  }
  if (options.optimizer.combine_grad_stats || options.optimizer.grad_divisor != 1.0F) {
    return invalid(
        "optimizer.combine_grad_stats and grad_divisor are the engine's own; leave them unset");
  }
  if (options.groups.empty()) options.groups.push_back(options.optimizer.defaults);
  auto impl = std::make_unique<Impl>(runtime, comm, options);
  Impl& s = *impl;
  s.rank = static_cast<uint32_t>(comm.rank());
  s.ranks = static_cast<uint32_t>(comm.size());
  s.param_bytes = element_bytes(options.param_type);
  s.grad_bytes = element_bytes(options.grad_type);
  // The collectives' buffers are the GPU tier's (Gloo's data crosses to the host through bounce
  // buffers on a CUDA device: zero_collectives.cc); the host reads what it must in host memory.
  const bool host_device = runtime.device().backend() == Backend::kHost;
  s.comm_tier = TierKind::kGpu;
  s.host_tier = host_device ? TierKind::kGpu : TierKind::kCpu;

  std::vector<ZeroLayoutParam> lp;
  for (const ZeroParam& p : params) {
    if (p.group >= s.options.groups.size()) {
      return invalid(absl::StrFormat(
          "parameter '%s' names hyper-parameter group %d; ZeroOptions.groups has %d", p.name,
          p.group, s.options.groups.size()));
    }
    ZeroLayoutParam l;
    l.name = p.name;
    l.shape = p.shape.empty() ? std::vector<int64_t>{1} : p.shape;
    l.adam_group = p.group;
    uint64_t count = 1;
    for (int64_t d : l.shape) count *= d > 0 ? static_cast<uint64_t>(d) : 1;
    l.persistent = options.stage == 3 && count * s.param_bytes < options.persist_below_bytes;
    lp.push_back(std::move(l));
  }
  const uint64_t group_elements = std::max<uint64_t>(1, options.bucket_bytes / s.grad_bytes);
  auto layout = ZeroLayout::plan(std::move(lp), s.ranks, group_elements, options.alignment);
  if (!layout.ok()) {
    return absl::Status(layout.status().code(),
                        absl::StrCat(layout.status().message(),
                                     " (ZeroOptions.bucket_bytes, alignment, or the parameters)"));
  }
  s.layout = *std::move(layout);
  // Unset: automatic, room for the largest gathered group at least (bound_live_limit() then
  // fits it to the tier, silently).
  s.live_limit = options.max_live_bytes.value_or(kAutoMaxLiveBytes);
  if (options.stage == 3) {
    for (uint32_t g = 0; g < s.layout.groups().size(); ++g) {
      if (s.layout.groups()[g].persistent) continue;
      if (!options.max_live_bytes) {
        s.live_limit = std::max(s.live_limit, s.gathered_bytes(g));
      } else if (s.gathered_bytes(g) > *options.max_live_bytes) {
        return invalid(absl::StrFormat(
            "parameter group %d gathers to %d bytes, above max_live_bytes = %d; raise "
            "max_live_bytes (or leave it unset: automatic) or lower bucket_bytes",
            g, s.gathered_bytes(g), *options.max_live_bytes));
      }
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].initial.empty() && params[i].fill) {
      return invalid(
          absl::StrFormat("parameter '%s' has both initial values and a fill function; "
                          "give one",
                          params[i].name));
    }
    if (!params[i].initial.empty() && params[i].initial.size() != s.layout.params()[i].count) {
      return invalid(absl::StrFormat("parameter '%s' has %d initial values for %d elements",
                                     params[i].name, params[i].initial.size(),
                                     s.layout.params()[i].count));
    }
  }

  if (auto st = s.start_collectives(); !st.ok()) return st;

  OffloadOptimizerOptions o = options.optimizer;
  Impl* raw = &s;
  o.combine_grad_stats = [raw](const GradStatistics& local) { return raw->combine(local); };
  o.grad_divisor = static_cast<float>(s.ranks);
  auto optimizer = OffloadOptimizer::create(runtime, o);
  if (!optimizer.ok()) return optimizer.status();
  s.optimizer = *std::move(optimizer);
  for (size_t g = 1; g < s.options.groups.size(); ++g) {
    if (auto added = s.optimizer->add_group(s.options.groups[g]); !added.ok()) {
      return added.status();
    }
  }
  if (auto st = s.optimizer->set_group(0, s.options.groups[0]); !st.ok()) return st;
  {
    MutexLock lock(&s.mu);
    s.param_states.resize(params.size());
  }
  {
    MutexLock lock(&s.fetch_mu);
    s.gathered.resize(s.layout.groups().size());
    s.param_users.assign(params.size(), 0);
    s.secondary_fresh.assign(s.layout.groups().size(), false);
  }
  if (auto st = s.start_hpz(); !st.ok()) return st;
  auto engine = std::make_unique<ZeroEngine>(std::move(impl));
  if (s.gloo) s.completer = std::thread([raw] { raw->run_completer(); });
  if (auto st = engine->impl_->create_tensors(params); !st.ok()) return st;
  if (options.stage == 3) {
    if (auto st = engine->impl_->bound_live_limit(); !st.ok()) return st;
  }
  {
    MutexLock lock(&s.mu);
    s.comm_mark = s.comm_bytes();
  }
  engine->impl_->reducer = std::thread([raw] { raw->run_reducer(); });
  return engine;
}

absl::Status ZeroEngine::Impl::create_tensors(std::span<const ZeroParam> params) {
  TensorStore& store = runtime.store();
  auto make = [&](std::string name, uint64_t bytes, TierKind home) {
    auto t = store.create(std::move(name), bytes, home);
    if (!t.ok()) {
      return absl::StatusOr<TensorHandle>(
          absl::Status(t.status().code(), absl::StrCat("ZeroEngine: ", t.status().message())));
    }
    return t;
  };
  uint64_t largest = 0;
  for (uint32_t g = 0; g < layout.groups().size(); ++g) {
    const ZeroFlatGroup& fg = layout.groups()[g];
    Group group;
    group.members = fg.segment_count;
    group.partitioned = options.stage == 3 && !fg.persistent;
    largest = std::max(largest, fg.padded);
    // Stage 3's partitioned groups hold only this rank's slice; every other group is whole.
    auto p = group.partitioned ? make(absl::StrCat("zero.group", g, ".shard_params"),
                                      fg.shard * param_bytes, options.param_home)
                               : make(absl::StrCat("zero.group", g, ".params"),
                                      fg.padded * param_bytes, whole_home());
    if (!p.ok()) return p.status();
    (group.partitioned ? group.shard_params : group.params) = *p;
    if (group.partitioned && node_comm != nullptr) {
      auto secondary = make(absl::StrCat("zero.group", g, ".secondary_params"),
                            fg.padded / node_ranks * param_bytes, options.param_home);
      if (!secondary.ok()) return secondary.status();
      group.secondary = *secondary;
    }
    groups.push_back(group);
    const TensorHandle written = *p;
    const uint64_t first = group.partitioned ? static_cast<uint64_t>(rank) * fg.shard : 0;
    const uint64_t written_count = group.partitioned ? fg.shard : fg.padded;
    // The whole group in fp32 (padding zero): its rounded copy is the model's parameters, this
    // rank's slice the optimizer's master.
    std::vector<float> initial(fg.padded, 0.0F);
    for (const ZeroSegment& seg : layout.group_segments(g)) {
      const ZeroParam& param = params[seg.param];
      float* at = initial.data() + seg.group_offset;
      if (param.fill) {
        // Segments are whole parameters (the layout never splits one).
        const absl::Status st = param.fill(std::span<float>(at, seg.count));
        if (!st.ok()) {
          return absl::Status(st.code(), absl::StrCat("ZeroEngine: filling the initial values of '",
                                                      param.name, "': ", st.message()));
        }
      } else if (!param.initial.empty()) {
        std::copy(param.initial.begin(), param.initial.end(), at);
      }
    }
    auto data = store.acquire(written, host_tier, *host_stream, AccessMode::kWrite);
    if (!data.ok()) return data.status();
    if (auto st = runtime.device().synchronize(*host_stream); !st.ok()) return st;
    round_master(initial.data() + first, options.param_type, *data, written_count);
    if (auto st = store.release(written, *host_stream); !st.ok()) return st;

    ParamSpec spec;
    spec.name = absl::StrCat("zero.group", g, ".shard");
    spec.param = written;
    spec.param_offset =
        group.partitioned ? 0 : static_cast<uint64_t>(rank) * fg.shard * param_bytes;
    spec.param_host_tier = host_tier;
    spec.param_type = options.param_type;
    spec.grad_type = options.grad_type;
    spec.count = fg.shard;
    spec.group = fg.adam_group;
    spec.initial_master =
        std::span<const float>(initial).subspan(static_cast<size_t>(rank) * fg.shard, fg.shard);
    if (options.stage == 1) {
      auto grads =
          make(absl::StrCat("zero.group", g, ".grads"), fg.padded * grad_bytes, options.param_home);
      if (!grads.ok()) return grads.status();
      groups.back().grads = *grads;
      if (auto st = zero_tensor(*grads, fg.padded * grad_bytes); !st.ok()) return st;
      spec.grad = *grads;
      spec.grad_source = GradSource::kView;
      spec.grad_offset = static_cast<uint64_t>(rank) * fg.shard * grad_bytes;
      spec.grad_tier = host_tier;
    } else {
      spec.grad_source = GradSource::kHost;
    }
    auto id = optimizer->add_param(spec);
    if (!id.ok()) return id.status();
    groups.back().shard = *id;
  }
  if (options.stage >= 2) {
    bucket_bytes = largest * grad_bytes;
    for (uint32_t b = 0; b < options.gradient_buckets; ++b) {
      // Stage 3 offloads parameters, not the constant-size buckets backward writes into.
      auto t = make(absl::StrCat("zero.bucket", b), bucket_bytes,
                    options.stage == 3 ? TierKind::kGpu : options.param_home);
      if (!t.ok()) return t.status();
      buckets.push_back(*t);
      if (auto st = zero_tensor(*t, bucket_bytes); !st.ok()) return st;
      MutexLock lock(&mu);
      free_buckets.push_back(static_cast<int>(b));
    }
  }
  if (auto st = drop_host_copies(); !st.ok()) return st;
  return runtime.device().synchronize(*host_stream);
}

absl::Status ZeroEngine::Impl::drop_host_copies() {
  // The optimizer writes parameters it sets from a master (registration, load) through the CPU
  // tier; parameters homed elsewhere go back home rather than keep a second copy there.
  // Stage 3's shards go home from every tier: until a use gathers them, the memory is the
  // gathered parameters', and an NVMe-homed shard is read from its drive once per step.
  for (const Group& g : groups) {
    if (g.partitioned) {
      for (TierKind tier : {TierKind::kCpu, TierKind::kGpu}) {
        if (tier == options.param_home) continue;
        if (auto st = runtime.store().evict(g.shard_params, tier); !st.ok()) return st;
        if (!g.secondary.valid()) continue;  // hpZ's slice: also home until a gather writes it
        if (auto st = runtime.store().evict(g.secondary, tier); !st.ok()) return st;
      }
    } else if (whole_home() != TierKind::kCpu) {
      if (auto st = runtime.store().evict(g.params, TierKind::kCpu); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

ZeroEngine::ZeroEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ZeroEngine::~ZeroEngine() {
  Impl& s = *impl_;
  {
    MutexLock lock(&s.mu);
    s.stopping = true;
    s.changed.SignalAll();
  }
  if (s.reducer.joinable()) s.reducer.join();
  {
    // Gathers in flight end first (their waits are bounded by the communicator's timeout).
    MutexLock lock(&s.fetch_mu);
    for (uint32_t g = 0; g < s.gathered.size(); ++g) {
      s.gathered[g].users = 0;
      (void)s.drop_gathered(g, /*now=*/true);
    }
    (void)s.reap(Impl::kAllRetired);
  }
  // Every collective handed to the completer ends and its flag goes up: no stream (the engine's
  // or the trainer's) is left waiting.
  s.stop_collectives();
  s.optimizer.reset();
  TensorStore& store = s.runtime.store();
  for (const Impl::Group& g : s.groups) {
    for (TensorHandle t : {g.params, g.grads, g.shard_params, g.secondary}) {
      if (t.valid()) (void)store.destroy(t);
    }
  }
  for (TensorHandle t : s.buckets) (void)store.destroy(t);
}

absl::StatusOr<ZeroParamId> ZeroEngine::find(std::string_view name) const {
  const auto& params = impl_->layout.params();
  for (uint32_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) return ZeroParamId{i};
  }
  return absl::NotFoundError(
      absl::StrCat("ZeroEngine: no parameter named '", std::string(name), "'"));
}

uint32_t ZeroEngine::param_count() const {
  return static_cast<uint32_t>(impl_->layout.params().size());
}
const ZeroLayout& ZeroEngine::layout() const { return impl_->layout; }
const ZeroOptions& ZeroEngine::options() const { return impl_->options; }
OffloadOptimizer& ZeroEngine::optimizer() { return *impl_->optimizer; }
Communicator& ZeroEngine::communicator() { return impl_->comm; }
Communicator* ZeroEngine::node_communicator() { return impl_->node_comm.get(); }
Runtime& ZeroEngine::runtime() { return impl_->runtime; }

absl::StatusOr<ZeroTensorView> ZeroEngine::param_view(ZeroParamId id) const {
  if (auto st = impl_->check_param(id); !st.ok()) return st;
  const ZeroSegment& seg = impl_->layout.param_segment(id.index);
  if (impl_->groups[seg.group].partitioned) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ZeroEngine::param_view: at stage 3 parameter '%s' exists whole only while gathered; "
        "use acquire_param()/release_param()",
        impl_->layout.params()[id.index].name));
  }
  return ZeroTensorView{impl_->groups[seg.group].params, seg.group_offset * impl_->param_bytes,
                        seg.count};
}

absl::StatusOr<GradStatistics> ZeroEngine::Impl::combine(const GradStatistics& local) {
  double values[2] = {local.sq_sum, local.non_finite ? 1.0 : 0.0};
  auto work = comm.all_reduce(values, values, 2, DataType::kFloat64, ReduceOp::kSum);
  if (!work.ok()) return fail(work.status());
  if (auto st = (*work)->wait(); !st.ok()) return fail(st);
  return GradStatistics{values[0], values[1] > 0};
}

absl::Status ZeroEngine::Impl::gather_params() {
  // Each group's gather is ordered on gather_stream and the group released at once: work that
  // reads the parameters waits on the stream, the host does not, and the store may move a group
  // whose gather has ended to make room for the next (the model's parameters need not fit in
  // the GPU arena together).
  TensorStore& store = runtime.store();
  for (uint32_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].params.valid()) continue;  // stage 3: gathered on use
    const ZeroFlatGroup& fg = layout.groups()[g];
    auto data = store.acquire(groups[g].params, comm_tier, *gather_stream, AccessMode::kWrite);
    if (!data.ok()) return data.status();
    auto* base = static_cast<std::byte*>(*data);
    absl::Status status = gather(base + static_cast<uint64_t>(rank) * fg.shard * param_bytes, base,
                                 fg.shard, nullptr);
    if (auto st = store.release(groups[g].params, *gather_stream); !st.ok() && status.ok()) {
      status = st;
    }
    if (!status.ok()) return status;
    MutexLock lock(&mu);
    ++counters.all_gathers;
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> ZeroEngine::step() {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  const absl::Time start = absl::Now();
  if (s.options.stage == 3) {
    // The gathered copies are about to be stale (and the arena is the optimizer's to use).
    if (auto st = s.drop_all_gathered("step()"); !st.ok()) {
      return st.code() == absl::StatusCode::kFailedPrecondition ? st : s.fail(st);
    }
  }
  s.wait_for_reductions();
  const uint64_t wait_ns = since_ns(start);
  if (auto st = s.failure(); !st.ok()) return st;
  {
    MutexLock lock(&s.mu);
    for (uint32_t g = 0; g < s.groups.size(); ++g) {
      const Impl::Group& group = s.groups[g];
      if (group.completed == s.options.accumulation_steps && group.ready == 0) continue;
      std::string missing;
      for (const ZeroSegment& seg : s.layout.group_segments(g)) {
        if (!s.param_states[seg.param].ready) {
          absl::StrAppend(&missing, missing.empty() ? "" : ", ", s.layout.params()[seg.param].name);
        }
      }
      return absl::FailedPreconditionError(absl::StrFormat(
          "ZeroEngine::step(): parameter group %d has completed %d of %d micro-steps%s; announce "
          "every parameter's gradient (acquire_grad, grad_ready) %d time(s) per step, on every "
          "rank, or zero_grad() on every rank to drop them",
          g, group.completed, s.options.accumulation_steps,
          group.ready > 0 ? absl::StrCat(" (waiting for ", missing, ")") : std::string(),
          s.options.accumulation_steps));
    }
  }
  const absl::Time optimizer_start = absl::Now();
  auto result = s.optimizer->step();
  const uint64_t optimizer_ns = since_ns(optimizer_start);
  if (!result.ok()) {
    if (auto st = s.failure(); !st.ok()) return st;  // the Communicator's error
    return result.status();
  }
  const absl::Time gather_start = absl::Now();
  if (!result->skipped) {
    if (auto st = s.gather_params(); !st.ok()) {
      return s.fail(absl::Status(st.code(), absl::StrCat("ZeroEngine::step(): gathering the "
                                                         "updated parameters: ",
                                                         st.message())));
    }
  }
  if (s.options.stage == 3) {
    if (auto st = s.drop_host_copies(); !st.ok()) return s.fail(st);
    if (auto st = s.next_step_order(); !st.ok()) return s.fail(st);
  }
  const uint64_t gather_ns = since_ns(gather_start);
  if (s.options.stage == 1) {
    for (uint32_t g = 0; g < s.groups.size(); ++g) {
      const uint64_t bytes = s.layout.groups()[g].padded * s.grad_bytes;
      if (auto st = s.zero_tensor(s.groups[g].grads, bytes); !st.ok()) return s.fail(st);
    }
  }
  MutexLock lock(&s.mu);
  for (Impl::Group& g : s.groups) g.completed = 0;
  ++s.counters.steps;
  s.counters.micro_steps = 0;
  const uint64_t comm_now = s.comm_bytes();
  s.counters.last_step_comm_bytes = comm_now - s.comm_mark;
  s.comm_mark = comm_now;
  s.counters.last_step_ns = since_ns(start);
  s.counters.last_step_wait_ns = wait_ns;
  s.counters.last_optimizer_ns = optimizer_ns;
  s.counters.last_gather_ns = gather_ns;
  return result;
}

namespace {
absl::Status no_group(std::string_view caller, uint32_t group, size_t groups) {
  return absl::NotFoundError(absl::StrFormat(
      "ZeroEngine::%s: no hyper-parameter group %d; the engine has %d (ZeroOptions::groups)",
      caller, group, groups));
}
}  // namespace

absl::Status ZeroEngine::set_group(uint32_t group, const AdamGroup& hyper) {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  if (auto st = s.failure(); !st.ok()) return st;
  if (group >= s.options.groups.size())
    return no_group("set_group", group, s.options.groups.size());
  absl::Status st = s.optimizer->set_group(group, hyper);
  if (st.ok()) return st;
  return absl::Status(st.code(),
                      absl::StrCat("ZeroEngine::set_group(", group, "): ", st.message()));
}

absl::StatusOr<AdamGroup> ZeroEngine::group(uint32_t group) const {
  if (group >= impl_->options.groups.size()) {
    return no_group("group", group, impl_->options.groups.size());
  }
  return impl_->optimizer->group(group);
}

ZeroMemory ZeroEngine::memory() const {
  const Impl& s = *impl_;
  TensorStore& store = s.runtime.store();
  ZeroMemory m;
  auto add = [&](std::array<uint64_t, 3>& into, TensorHandle t) {
    if (!t.valid()) return;
    if (auto info = store.info(t); info.ok()) into[static_cast<size_t>(info->home)] += info->bytes;
  };
  auto add_named = [&](std::array<uint64_t, 3>& into, const std::string& name) {
    if (auto t = store.find(name); t.ok()) add(into, *t);
  };
  for (uint32_t g = 0; g < s.groups.size(); ++g) {
    add(m.params, s.groups[g].params);
    add(m.params, s.groups[g].shard_params);
    add(m.params, s.groups[g].secondary);
    add(m.grads, s.groups[g].grads);
    const std::string shard = absl::StrCat("zero.group", g, ".shard");
    add_named(m.grads, shard + ".grad.host");
    // With the overlapped step, also its backups and held copies (created on first use).
    for (const char* state : {".master", ".exp_avg", ".exp_avg_sq", ".overlap.master",
                              ".overlap.exp_avg", ".overlap.exp_avg_sq", ".overlap.copy"}) {
      add_named(m.optimizer_states, shard + state);
    }
  }
  for (TensorHandle t : s.buckets) add(m.buckets, t);
  {
    MutexLock lock(&s.mu);
    m.gathered = s.counters.gathered_bytes;
    m.retiring = s.counters.retiring_bytes;
  }
  if (s.options.optimizer.state_home == TierKind::kNvme) {
    // Two swap slots of master and moments (a step writes the one not committed).
    m.optimizer_states[static_cast<size_t>(TierKind::kNvme)] +=
        s.optimizer->stats().nvme_state_bytes;
  }
  return m;
}

ZeroStats ZeroEngine::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->counters;
}

}  // namespace strata
