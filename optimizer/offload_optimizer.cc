// OffloadOptimizer's public API: creation, parameter groups and registration, inspection (the
// step, gradient landing, NVMe states and checkpoints have files of their own).
#include "strata/optimizer/offload_optimizer.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "optimizer_impl.h"
#include "strata/base/format_bytes.h"
#include "strata/base/mutex.h"

namespace strata {

namespace {

// Pipeline chunks of the optimizer's own pool (no NVMe tier): big enough that a chunk's step
// dwarfs the per-chunk overhead, small enough that the last chunk's H2D copy, which nothing
// overlaps, is short.
constexpr uint64_t kOwnPoolChunkBytes = uint64_t{16} << 20;
constexpr uint64_t kOwnPoolChunks = 4;
// NVMe chunks hold [master | exp_avg | exp_avg_sq | parameter copy]: 12 + 2 bytes an element;
// element counts are multiples of kNvmeChunkGranule so that every part starts 4 KiB-aligned for
// O_DIRECT.
constexpr uint64_t kNvmeBytesPerElement = 14;

absl::Status invalid(std::string_view what, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("OffloadOptimizer: ", std::string(what), " ", std::string(why)));
}

bool finite(float x) { return std::isfinite(x); }

absl::Status validate_group(const AdamGroup& g) {
  absl::Status st = validate_adam(g);
  if (st.ok()) return st;
  return absl::InvalidArgumentError(absl::StrCat("OffloadOptimizer: ", st.message()));
}

absl::Status validate_scale(float scale) {
  if (!finite(scale) || scale <= 0) {
    return invalid("loss scale", absl::StrCat(scale, " must be finite and > 0"));
  }
  return absl::OkStatus();
}

absl::Status validate(const OffloadOptimizerOptions& o) {
  if (o.state_home != TierKind::kCpu && o.state_home != TierKind::kNvme) {
    return invalid("state_home", "must be the cpu or the nvme tier (states never live on the GPU)");
  }
  if (auto st = validate_group(o.defaults); !st.ok()) return st;
  if (!finite(o.max_grad_norm) || o.max_grad_norm < 0) {
    return invalid("max_grad_norm",
                   absl::StrCat(o.max_grad_norm, " must be finite, >= 0 (0: off)"));
  }
  const LossScaling& ls = o.loss_scaling;
  if (auto st = validate_scale(ls.scale); !st.ok()) return st;
  if (ls.dynamic) {
    if (!(ls.growth_factor > 1) || !finite(ls.growth_factor)) {
      return invalid("loss_scaling.growth_factor", "must be finite and > 1");
    }
    if (!(ls.backoff_factor > 0 && ls.backoff_factor < 1)) {
      return invalid("loss_scaling.backoff_factor", "must be in (0, 1)");
    }
    if (ls.growth_interval == 0) return invalid("loss_scaling.growth_interval", "must be >= 1");
    if (auto st = validate_scale(ls.min_scale); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<OffloadOptimizer>> OffloadOptimizer::create(
    Runtime& runtime, OffloadOptimizerOptions options) {
  if (auto st = validate(options); !st.ok()) return st;
  const bool on_nvme = options.state_home == TierKind::kNvme;
  if (on_nvme && runtime.nvme() == nullptr) {
    return absl::FailedPreconditionError(
        "OffloadOptimizer: optimizer states on NVMe need an NVMe tier; set STRATA_NVME_PATHS "
        "to one or more directories on fast drives");
  }
  auto impl = std::make_unique<Impl>(runtime, options);
  auto adam_pool = CpuPool::create(options.adam_pool.value_or(runtime.config().adam_pool));
  if (!adam_pool.ok()) {
    return absl::Status(adam_pool.status().code(),
                        absl::StrCat("OffloadOptimizer: ", adam_pool.status().message()));
  }
  impl->adam_pool = *std::move(adam_pool);
  impl->pool = runtime.staging();
  if (impl->pool == nullptr) {
    // At most a sixteenth of the CPU tier, so small test tiers still hold tensors.
    const uint64_t chunk =
        std::min(kOwnPoolChunkBytes, runtime.cpu().capacity() / 16 / 4096 * 4096);
    auto pool = chunk == 0 ? absl::StatusOr<std::unique_ptr<StagingPool>>(
                                 absl::ResourceExhaustedError("the CPU tier is too small"))
                           : StagingPool::create(runtime.cpu(), chunk * kOwnPoolChunks, chunk);
    if (!pool.ok()) {
      return absl::Status(pool.status().code(),
                          absl::StrCat("OffloadOptimizer: pinned buffers for the parameter "
                                       "updates (",
                                       format_bytes(chunk * kOwnPoolChunks), " of the CPU tier): ",
                                       pool.status().message(), "; raise STRATA_CPU_BYTES"));
    }
    impl->own_pool = *std::move(pool);
    impl->pool = impl->own_pool.get();
  }
  const uint64_t lease = impl->pool->chunk_bytes();
  const uint64_t max_elements =
      on_nvme ? lease / kNvmeBytesPerElement / kNvmeChunkGranule * kNvmeChunkGranule : lease / 2;
  if (max_elements == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "OffloadOptimizer: staging chunks of %s are too small for an NVMe state chunk (%d "
        "elements × %d bytes); raise STRATA_STAGING_BYTES",
        format_bytes(lease), kNvmeChunkGranule, kNvmeBytesPerElement));
  }
  uint64_t elements = max_elements;
  if (options.chunk_elements > 0) {
    if (options.chunk_elements > max_elements) {
      return invalid("chunk_elements",
                     absl::StrFormat("%d exceeds the %d elements a staging chunk of %s holds; "
                                     "lower it or raise STRATA_STAGING_BYTES",
                                     options.chunk_elements, max_elements, format_bytes(lease)));
    }
    elements = options.chunk_elements;
    if (on_nvme) {
      elements = std::max(kNvmeChunkGranule, elements / kNvmeChunkGranule * kNvmeChunkGranule);
    }
  }
  impl->chunk_elements = elements;
  for (auto* stream :
       {&impl->d2h_stream, &impl->h2d_stream, &impl->lander_stream, &impl->early_stream}) {
    auto created = runtime.device().create_stream();
    if (!created.ok()) return created.status();
    *stream = *std::move(created);
  }
  {
    MutexLock lock(&impl->state_mu);
    impl->groups.push_back(options.defaults);
    impl->loss_scale = options.loss_scaling.scale;
    impl->counters.chunk_elements = elements;
  }
  Impl* raw = impl.get();
  impl->lander = std::thread([raw] { raw->run_lander(); });
  if (options.overlap.enabled) {
    impl->stepper = std::thread([raw] { raw->run_stepper(); });
    impl->arm();
  }
  return std::make_unique<OffloadOptimizer>(std::move(impl));
}

OffloadOptimizer::OffloadOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

OffloadOptimizer::~OffloadOptimizer() {
  Impl& s = *impl_;
  s.wait_for_landings();
  {
    MutexLock lock(&s.landing_mu);
    s.stopping = true;
    s.landing_changed.SignalAll();
  }
  s.lander.join();
  if (s.stepper.joinable()) s.stepper.join();
  (void)s.runtime.device().synchronize(*s.early_stream);
  (void)s.runtime.device().synchronize(*s.h2d_stream);
  (void)s.runtime.device().synchronize(*s.d2h_stream);
  (void)s.runtime.device().synchronize(*s.lander_stream);
  TensorStore& store = s.runtime.store();
  MutexLock lock(&s.state_mu);
  for (const Impl::Param& p : s.params) {
    for (TensorHandle t : {p.grad_host, p.master, p.exp_avg, p.exp_avg_sq, p.backup[0], p.backup[1],
                           p.backup[2], p.held_copy}) {
      if (t.valid() && (t != p.grad_host || p.owns_grad_host)) (void)store.destroy(t);
    }
  }
  if (SwapSpace* nvme = s.runtime.nvme(); nvme != nullptr) {
    for (const Impl::NvmeChunk& c : s.chunks) {
      for (ExtentHandle e : c.slots) {
        if (e.valid()) (void)nvme->free(e);
      }
    }
  }
}

absl::StatusOr<uint32_t> OffloadOptimizer::add_group(const AdamGroup& group) {
  if (auto st = validate_group(group); !st.ok()) return st;
  MutexLock lock(&impl_->state_mu);
  impl_->groups.push_back(group);
  return static_cast<uint32_t>(impl_->groups.size() - 1);
}

absl::Status OffloadOptimizer::set_group(uint32_t group, const AdamGroup& hyper) {
  if (auto st = validate_group(hyper); !st.ok()) return st;
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);  // between steps: never under a running step()
  std::vector<AdamGroup> now;
  {
    MutexLock lock(&s.state_mu);
    if (group >= s.groups.size()) {
      return absl::NotFoundError(absl::StrFormat(
          "OffloadOptimizer: no parameter group %d (there are %d)", group, s.groups.size()));
    }
    s.groups[group] = hyper;
    now = s.groups;
  }
  s.retarget_early(std::move(now));
  return absl::OkStatus();
}

absl::StatusOr<AdamGroup> OffloadOptimizer::group(uint32_t group) const {
  MutexLock lock(&impl_->state_mu);
  if (group >= impl_->groups.size()) {
    return absl::NotFoundError(absl::StrFormat(
        "OffloadOptimizer: no parameter group %d (there are %d)", group, impl_->groups.size()));
  }
  return impl_->groups[group];
}

absl::Status OffloadOptimizer::set_loss_scale(float scale) {
  if (auto st = validate_scale(scale); !st.ok()) return st;
  MutexLock lock(&impl_->state_mu);
  impl_->loss_scale = scale;
  impl_->good_steps = 0;
  return absl::OkStatus();
}

absl::StatusOr<OffloadOptimizer::Impl::Param> OffloadOptimizer::Impl::param_copy(ParamId id) const {
  MutexLock lock(&state_mu);
  if (id.index >= params.size()) {
    return absl::NotFoundError(absl::StrFormat(
        "OffloadOptimizer: no parameter with id %d (%d are registered)", id.index, params.size()));
  }
  return params[id.index];
}

std::vector<OffloadOptimizer::Impl::Param> OffloadOptimizer::Impl::params_snapshot() const {
  MutexLock lock(&state_mu);
  return params;
}

absl::Status OffloadOptimizer::Impl::write_param_tensor(const Param& p, uint64_t offset,
                                                        const float* master, uint64_t count) {
  TensorStore& store = runtime.store();
  auto data = store.acquire(p.param, p.param_host_tier, *h2d_stream, AccessMode::kWrite);
  if (!data.ok()) return data.status();
  // The host writes: earlier device work on the tensor (an H2D update) must be done.
  if (auto st = runtime.device().synchronize(*h2d_stream); !st.ok()) {
    (void)store.release(p.param, *h2d_stream);
    return st;
  }
  round_master(
      master, p.param_type,
      static_cast<std::byte*>(*data) + p.param_offset + offset * element_bytes(p.param_type),
      count);
  return store.release(p.param, *h2d_stream);
}

absl::StatusOr<ParamId> OffloadOptimizer::add_param(const ParamSpec& spec) {
  Impl& s = *impl_;
  TensorStore& store = s.runtime.store();
  MutexLock step_lock(&s.step_mu);
  if (auto st = s.roll_back_early(/*rearm=*/false); !st.ok()) return st;
  const Impl::Rearm rearm{s};  // with the new parameter among the units
  const std::string& name = spec.name;
  if (name.empty()) return invalid("ParamSpec.name", "is empty");
  if (spec.count == 0) return invalid(absl::StrCat("parameter '", name, "'"), "has count 0");
  if (spec.param_type != ParamType::kF32 && spec.param_type != ParamType::kF16 &&
      spec.param_type != ParamType::kBF16) {
    return invalid(absl::StrCat("parameter '", name, "'"), "has an unknown param_type");
  }
  if (spec.grad_type != GradType::kF32 && spec.grad_type != GradType::kF16 &&
      spec.grad_type != GradType::kBF16) {
    return invalid(absl::StrCat("parameter '", name, "'"), "has an unknown grad_type");
  }
  if (!spec.initial_master.empty() && spec.initial_master.size() != spec.count) {
    return invalid(absl::StrCat("parameter '", name, "'"),
                   absl::StrFormat("has %d initial master values for count %d",
                                   spec.initial_master.size(), spec.count));
  }
  {
    MutexLock lock(&s.state_mu);
    if (spec.group >= s.groups.size()) {
      return invalid(absl::StrCat("parameter '", name, "'"),
                     absl::StrFormat("names group %d; add_group() it first (there are %d)",
                                     spec.group, s.groups.size()));
    }
    for (const Impl::Param& p : s.params) {
      if (p.name == name) {
        return absl::AlreadyExistsError(
            absl::StrCat("OffloadOptimizer: a parameter named '", name, "' is registered"));
      }
    }
  }
  const uint64_t param_bytes = spec.count * element_bytes(spec.param_type);
  const uint64_t grad_bytes = spec.count * element_bytes(spec.grad_type);
  if (spec.grad_source == GradSource::kView && spec.grad_tier == TierKind::kNvme) {
    return invalid(absl::StrCat("parameter '", name, "'"),
                   "reads its gradient view from the NVMe tier; name the gpu or cpu tier");
  }
  // A kHost gradient needs no device tensor; the others must hold the parameter's elements from
  // their offset on.
  struct Check {
    TensorHandle handle;
    const char* what;
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<Check> checks = {{spec.param, "param", spec.param_offset, param_bytes}};
  if (spec.grad_source != GradSource::kHost || spec.grad.valid()) {
    checks.push_back({spec.grad, "grad", spec.grad_offset, grad_bytes});
  }
  for (auto [handle, what, offset, expected] : checks) {
    auto info = store.info(handle);
    if (!info.ok()) {
      return absl::Status(info.status().code(),
                          absl::StrCat("OffloadOptimizer: parameter '", name, "': its ", what,
                                       " tensor: ", info.status().message()));
    }
    // A tensor may hold more than the parameter (a view into a flat buffer), never less.
    if (info->bytes < offset + expected) {
      return invalid(
          absl::StrCat("parameter '", name, "'"),
          absl::StrFormat("has %s tensor '%s' of %d bytes; %d elements of its dtype "
                          "from byte %d need %d",
                          what, info->name, info->bytes, spec.count, offset, offset + expected));
    }
  }

  Impl::Param p;
  p.name = name;
  p.param = spec.param;
  p.grad = spec.grad;
  p.param_type = spec.param_type;
  p.grad_type = spec.grad_type;
  p.count = spec.count;
  p.group = spec.group;
  p.param_offset = spec.param_offset;
  p.param_host_tier = spec.param_host_tier;
  p.grad_source = spec.grad_source;
  std::vector<TensorHandle> created;
  auto cleanup = [&](absl::Status status) {
    for (TensorHandle t : created) (void)store.destroy(t);
    return absl::Status(status.code(), absl::StrCat("OffloadOptimizer: adding parameter '", name,
                                                    "': ", status.message()));
  };
  auto make = [&](const char* suffix, uint64_t bytes) -> absl::StatusOr<TensorHandle> {
    auto t = store.create(absl::StrCat(name, suffix), bytes, TierKind::kCpu);
    if (t.ok()) created.push_back(*t);
    return t;
  };

  // The master: given, or the parameter's current value widened.
  std::vector<float> master(spec.count);
  if (!spec.initial_master.empty()) {
    std::copy(spec.initial_master.begin(), spec.initial_master.end(), master.begin());
  } else {
    auto data = store.acquire(p.param, p.param_host_tier, *s.h2d_stream, AccessMode::kRead);
    if (!data.ok()) return cleanup(data.status());
    if (auto st = s.runtime.device().synchronize(*s.h2d_stream); !st.ok()) {
      (void)store.release(p.param, *s.h2d_stream);
      return cleanup(st);
    }
    widen_param(static_cast<const std::byte*>(*data) + p.param_offset, p.param_type, master.data(),
                p.count);
    if (auto st = store.release(p.param, *s.h2d_stream); !st.ok()) return cleanup(st);
  }

  if (spec.grad_source == GradSource::kView) {
    p.grad_host = spec.grad;
    p.owns_grad_host = false;
    p.grad_tier = spec.grad_tier;
    p.grad_offset = spec.grad_offset;
  } else {
    auto grad_host = make(".grad.host", grad_bytes);
    if (!grad_host.ok()) return cleanup(grad_host.status());
    p.grad_host = *grad_host;
  }
  if (s.options.state_home == TierKind::kCpu) {
    auto m = make(".master", spec.count * 4);
    if (!m.ok()) return cleanup(m.status());
    auto a = make(".exp_avg", spec.count * 4);
    if (!a.ok()) return cleanup(a.status());
    auto v = make(".exp_avg_sq", spec.count * 4);
    if (!v.ok()) return cleanup(v.status());
    p.master = *m;
    p.exp_avg = *a;
    p.exp_avg_sq = *v;
    for (TensorHandle t : {p.master, p.exp_avg, p.exp_avg_sq}) {
      auto data = store.acquire(t, TierKind::kCpu, *s.h2d_stream, AccessMode::kWrite);
      if (!data.ok()) return cleanup(data.status());
      if (t == p.master) {
        std::memcpy(*data, master.data(), spec.count * 4);
      } else {
        std::memset(*data, 0, spec.count * 4);
      }
      if (auto st = store.release(t, *s.h2d_stream); !st.ok()) return cleanup(st);
    }
  } else {
    uint64_t flat;
    {
      MutexLock lock(&s.state_mu);
      flat = s.elements;
    }
    p.flat_offset = flat;
    if (auto st = s.nvme_append(name, flat, spec.count, master.data()); !st.ok()) {
      return cleanup(st);
    }
  }
  if (!spec.initial_master.empty()) {
    if (auto st = s.write_param_tensor(p, 0, master.data(), p.count); !st.ok()) return cleanup(st);
  }

  MutexLock lock(&s.state_mu);
  s.params.push_back(p);
  s.elements += p.count;
  ++s.counters.params;
  s.counters.elements = s.elements;
  {
    MutexLock landing(&s.landing_mu);
    s.landings.emplace_back();
  }
  return ParamId{static_cast<uint32_t>(s.params.size() - 1)};
}

absl::StatusOr<ParamId> OffloadOptimizer::find_param(std::string_view name) const {
  MutexLock lock(&impl_->state_mu);
  for (uint32_t i = 0; i < impl_->params.size(); ++i) {
    if (impl_->params[i].name == name) return ParamId{i};
  }
  return absl::NotFoundError(
      absl::StrCat("OffloadOptimizer: no parameter named '", std::string(name), "'"));
}

absl::Status OffloadOptimizer::read_state(ParamId param, std::span<float> master,
                                          std::span<float> exp_avg, std::span<float> exp_avg_sq) {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  if (auto st = s.roll_back_early(/*rearm=*/true); !st.ok()) return st;
  auto p = s.param_copy(param);
  if (!p.ok()) return p.status();
  for (auto [span, what] : {std::pair{master, "master"}, std::pair{exp_avg, "exp_avg"},
                            std::pair{exp_avg_sq, "exp_avg_sq"}}) {
    if (!span.empty() && span.size() != p->count) {
      return invalid(
          absl::StrCat("read_state(", p->name, "): ", what),
          absl::StrFormat("holds %d values; the parameter has %d", span.size(), p->count));
    }
  }
  return s.read_param_state(*p, master.empty() ? nullptr : master.data(),
                            exp_avg.empty() ? nullptr : exp_avg.data(),
                            exp_avg_sq.empty() ? nullptr : exp_avg_sq.data());
}

absl::Status OffloadOptimizer::Impl::read_param_state(const Param& p, float* master, float* exp_avg,
                                                      float* exp_avg_sq) {
  if (options.state_home == TierKind::kCpu) {
    TensorStore& store = runtime.store();
    for (auto [t, out] : {std::pair{p.master, master}, std::pair{p.exp_avg, exp_avg},
                          std::pair{p.exp_avg_sq, exp_avg_sq}}) {
      if (out == nullptr) continue;
      auto data = store.acquire(t, TierKind::kCpu, *h2d_stream, AccessMode::kRead);
      if (!data.ok()) return data.status();
      std::memcpy(out, *data, p.count * 4);
      if (auto st = store.release(t, *h2d_stream); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // NVMe: chunk by chunk through one staging chunk.
  StagingPool::Lease lease = pool->acquire();
  const uint64_t first = p.flat_offset / chunk_elements;
  const uint64_t last = (p.flat_offset + p.count - 1) / chunk_elements;
  for (uint64_t c = first; c <= last; ++c) {
    Completion done;
    if (auto st = read_chunk(c, current_slot(c), lease.data(), done); !st.ok()) return st;
    if (auto st = done.wait(); !st.ok()) return st;
    const uint64_t chunk_begin = c * chunk_elements;
    const uint64_t begin = std::max(chunk_begin, p.flat_offset);
    const uint64_t end = std::min(chunk_begin + chunk_elements, p.flat_offset + p.count);
    const uint64_t stride = chunk_stride(c);
    const auto* base = static_cast<const float*>(lease.data());
    float* outs[3] = {master, exp_avg, exp_avg_sq};
    for (uint64_t a = 0; a < 3; ++a) {
      if (outs[a] == nullptr) continue;
      std::memcpy(outs[a] + (begin - p.flat_offset), base + a * stride + (begin - chunk_begin),
                  (end - begin) * 4);
    }
  }
  return absl::OkStatus();
}

uint64_t OffloadOptimizer::step_count() const {
  MutexLock lock(&impl_->state_mu);
  return impl_->step_count;
}

uint64_t OffloadOptimizer::param_step_count(ParamId param) const {
  MutexLock lock(&impl_->state_mu);
  return param.index < impl_->params.size() ? impl_->params[param.index].steps : 0;
}

float OffloadOptimizer::loss_scale() const {
  MutexLock lock(&impl_->state_mu);
  return impl_->loss_scale;
}

OffloadOptimizerStats OffloadOptimizer::stats() const {
  MutexLock lock(&impl_->state_mu);
  OffloadOptimizerStats out = impl_->counters;
  // Pipeline chunks over all registered elements (with states on NVMe, also swap chunks).
  out.chunks = (impl_->elements + impl_->chunk_elements - 1) / impl_->chunk_elements;
  out.nvme_state_bytes = impl_->nvme_state_bytes();
  return out;
}

absl::StatusOr<StepResult> OffloadOptimizer::step() {
  MutexLock step_lock(&impl_->step_mu);
  return impl_->step();
}

}  // namespace strata
