// Gradient landing: grad_ready() issues a gradient's D2H copy on the optimizer's own stream,
// so it overlaps the rest of backward; one lander thread waits for each copy and computes the
// gradient's sum of squares and inf/nan flag while the bytes are fresh, so step() knows the
// global norm without another pass.
//
// The first landing of a step copies straight into the parameter's CPU-tier gradient buffer.
// Later ones (gradient accumulation) go through staging chunks and are added to it; each
// addition also yields the statistics of the new sum.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cstring>

#include "optimizer_impl.h"
#include "strata/base/mutex.h"

namespace strata {

absl::Status OffloadOptimizer::grad_ready(ParamId param, Stream& stream,
                                          GradCompletion completion) {
  Impl& s = *impl_;
  auto p = s.param_copy(param);
  if (!p.ok()) return p.status();
  if (p->grad_source != GradSource::kDevice) {
    return absl::FailedPreconditionError(
        absl::StrCat("grad_ready('", p->name, "'): its gradient is announced with ",
                     p->grad_source == GradSource::kHost ? "land_grad()" : "grad_written()",
                     " (ParamSpec.grad_source), not grad_ready()"));
  }
  MutexLock issue(&s.issue_mu);
  if (absl::Status st = s.issue_landing(param.index, *p, stream, completion); !st.ok()) {
    MutexLock lock(&s.landing_mu);
    Impl::Landing& l = s.landings[param.index];
    if (l.failed.ok()) l.failed = st;
    return st;
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::Impl::issue_landing(uint32_t index, const Param& p, Stream& stream,
                                                   GradCompletion completion) {
  Device& device = runtime.device();
  TensorStore& store = runtime.store();
  auto ready = device.create_event();
  if (!ready.ok()) return ready.status();
  if (auto st = device.record(**ready, stream); !st.ok()) return st;
  if (auto st = device.wait(*d2h_stream, **ready); !st.ok()) return st;

  bool direct;
  bool final;
  {
    MutexLock lock(&landing_mu);
    const Landing& l = landings[index];
    direct = l.landed + l.pending == 0;
    final = final_of(completion);
  }
  auto grad = store.acquire(p.grad, TierKind::kGpu, *d2h_stream, AccessMode::kRead);
  if (!grad.ok()) return grad.status();
  const auto* src = static_cast<const std::byte*>(*grad);
  const uint64_t esize = element_bytes(p.grad_type);
  std::vector<LandingJob> issued;
  absl::Status status;
  if (direct) {
    auto host = store.acquire(p.grad_host, TierKind::kCpu, *d2h_stream, AccessMode::kWrite);
    if (!host.ok()) {
      status = host.status();
    } else {
      LandingJob job;
      job.param = index;
      job.direct = true;
      job.count = p.count;
      job.first_piece = job.last_piece = true;
      job.final = final;
      job.host = *host;
      status = device.copy_async(*host, src, p.count * esize, CopyKind::kDeviceToHost, *d2h_stream);
      if (status.ok()) {
        auto copied = device.create_event();
        status = copied.ok() ? device.record(**copied, *d2h_stream) : copied.status();
        if (status.ok()) job.copied = *std::move(copied);
      }
      if (status.ok()) {
        issued.push_back(std::move(job));
      } else {
        (void)device.synchronize(*d2h_stream);
        (void)store.release(p.grad_host, *d2h_stream);
      }
    }
  } else {
    // Pieces of a staging chunk each; a piece is added once its copy has landed. Leases come
    // back as the lander adds, so a gradient larger than the budget streams through it.
    const uint64_t per_piece = std::max<uint64_t>(1, pool->chunk_bytes() / esize);
    bool started = false;
    for (uint64_t offset = 0; offset < p.count && status.ok(); offset += per_piece) {
      LandingJob job;
      job.param = index;
      job.offset = offset;
      job.count = std::min(per_piece, p.count - offset);
      job.first_piece = offset == 0;
      job.last_piece = offset + job.count == p.count;
      job.final = final;
      job.lease = pool->acquire();
      status = device.copy_async(job.lease.data(), src + offset * esize, job.count * esize,
                                 CopyKind::kDeviceToHost, *d2h_stream);
      if (!status.ok()) break;
      auto copied = device.create_event();
      status = copied.ok() ? device.record(**copied, *d2h_stream) : copied.status();
      if (!status.ok()) break;
      job.copied = *std::move(copied);
      // Hand pieces over as they are issued: the lander frees their leases for later pieces.
      MutexLock lock(&landing_mu);
      if (job.first_piece) ++landings[index].pending;
      started = true;
      jobs.push_back(std::move(job));
      landing_changed.SignalAll();
    }
    if (!status.ok()) {
      (void)device.synchronize(*d2h_stream);
      // Pieces already queued started a landing; end it as failed, or it would stay pending.
      if (started) {
        LandingJob end;
        end.param = index;
        end.last_piece = true;
        end.aborted = status;
        MutexLock lock(&landing_mu);
        jobs.push_back(std::move(end));
        landing_changed.SignalAll();
      }
    }
  }
  if (auto st = store.release(p.grad, *d2h_stream); !st.ok() && status.ok()) status = st;
  if (!issued.empty()) {
    MutexLock lock(&landing_mu);
    ++landings[index].pending;
    for (LandingJob& job : issued) jobs.push_back(std::move(job));
    landing_changed.SignalAll();
  }
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("grad_ready('", p.name, "'): ", status.message(),
                                     "; the gradient is incomplete: zero_grad() and run backward "
                                     "again"));
  }
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::land_grad(ParamId param, const void* src,
                                         GradCompletion completion) {
  Impl& s = *impl_;
  auto p = s.param_copy(param);
  if (!p.ok()) return p.status();
  if (p->grad_source != GradSource::kHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "land_grad('", p->name, "'): the parameter was registered with another grad_source; ",
        "land_grad() takes GradSource::kHost parameters"));
  }
  if (src == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("land_grad('", p->name, "'): src is null"));
  }
  MutexLock issue(&s.issue_mu);
  bool first;
  bool final;
  {
    MutexLock lock(&s.landing_mu);
    s.before_grad_write(param.index);
    first = s.landings[param.index].landed == 0;
    final = s.final_of(completion);
  }
  TensorStore& store = s.runtime.store();
  const uint64_t bytes = p->count * element_bytes(p->grad_type);
  absl::StatusOr<AdamResult> stats = AdamResult{};
  auto host = store.acquire(p->grad_host, TierKind::kCpu, *s.d2h_stream, AccessMode::kWrite);
  if (!host.ok()) {
    stats = host.status();
  } else {
    if (first) {
      std::memcpy(*host, src, bytes);
      stats =
          grad_stats_with(s.options.isa, *host, p->grad_type, p->count, 1.0F, s.adam_pool.get());
    } else {
      stats = grad_accumulate_with(s.options.isa, *host, src, p->grad_type, p->count,
                                   s.adam_pool.get());
    }
    if (auto st = store.release(p->grad_host, *s.d2h_stream); !st.ok() && stats.ok()) stats = st;
  }
  {
    MutexLock counters_lock(&s.state_mu);
    if (stats.ok()) {
      ++s.counters.grads_landed;
      s.counters.grad_bytes_landed += bytes;
    }
  }
  MutexLock lock(&s.landing_mu);
  Impl::Landing& l = s.landings[param.index];
  if (!stats.ok()) {
    const absl::Status st(stats.status().code(),
                          absl::StrCat("land_grad('", p->name, "'): ", stats.status().message(),
                                       "; the gradient is incomplete: zero_grad() and run "
                                       "backward again"));
    if (l.failed.ok()) l.failed = st;
    return st;
  }
  ++l.landed;
  l.sq_sum = stats->grad_sq_sum;
  l.non_finite = stats->non_finite;
  s.note_landing(param.index, final);
  return absl::OkStatus();
}

absl::Status OffloadOptimizer::grad_written(ParamId param, GradCompletion completion) {
  Impl& s = *impl_;
  auto p = s.param_copy(param);
  if (!p.ok()) return p.status();
  if (p->grad_source != GradSource::kView) {
    return absl::FailedPreconditionError(absl::StrCat(
        "grad_written('", p->name, "'): the parameter was registered with another grad_source; ",
        "grad_written() takes GradSource::kView parameters"));
  }
  TensorStore& store = s.runtime.store();
  bool final;
  {
    MutexLock lock(&s.landing_mu);
    s.before_grad_write(param.index);
    final = s.final_of(completion);
  }
  absl::StatusOr<AdamResult> stats = AdamResult{};
  auto grad = store.acquire(p->grad_host, p->grad_tier, *s.d2h_stream, AccessMode::kRead);
  if (!grad.ok()) {
    stats = grad.status();
  } else if (auto synced = s.runtime.device().synchronize(*s.d2h_stream); !synced.ok()) {
    stats = synced;  // the host reads it: a copy into that tier must have landed
    (void)store.release(p->grad_host, *s.d2h_stream);
  } else {
    stats = grad_stats_with(s.options.isa, static_cast<const std::byte*>(*grad) + p->grad_offset,
                            p->grad_type, p->count, 1.0F, s.adam_pool.get());
    if (auto st = store.release(p->grad_host, *s.d2h_stream); !st.ok() && stats.ok()) stats = st;
  }
  MutexLock lock(&s.landing_mu);
  Impl::Landing& l = s.landings[param.index];
  if (!stats.ok()) {
    const absl::Status st(stats.status().code(), absl::StrCat("grad_written('", p->name,
                                                              "'): ", stats.status().message()));
    if (l.failed.ok()) l.failed = st;
    return st;
  }
  // The view is the gradient: announcing it again replaces its statistics.
  l.landed = 1;
  l.sq_sum = stats->grad_sq_sum;
  l.non_finite = stats->non_finite;
  s.note_landing(param.index, final);
  return absl::OkStatus();
}

void OffloadOptimizer::Impl::run_lander() {
  for (;;) {
    LandingJob job;
    {
      MutexLock lock(&landing_mu);
      while (jobs.empty() && !stopping) wait(&landing_changed, &landing_mu);
      if (jobs.empty()) return;
      job = std::move(jobs.front());
      jobs.pop_front();
    }
    absl::Status status = process(job);
    MutexLock lock(&landing_mu);
    Landing& l = landings[job.param];
    if (!status.ok() && l.failed.ok()) l.failed = status;
    if (job.last_piece) {
      --l.pending;
      ++l.landed;
      l.sq_sum = l.partial_sq;
      l.non_finite = l.partial_non_finite;
      if (status.ok()) note_landing(job.param, job.final);
    }
    landing_changed.SignalAll();
  }
}

absl::Status OffloadOptimizer::Impl::process(LandingJob& job) {
  Device& device = runtime.device();
  TensorStore& store = runtime.store();
  auto p = param_copy(ParamId{job.param});
  if (!p.ok()) return p.status();
  if (!job.aborted.ok()) return job.aborted;
  absl::Status status = device.synchronize(*job.copied);
  absl::StatusOr<AdamResult> stats = AdamResult{};
  if (job.direct) {
    // The buffer was acquired when the copy was issued; it is ours until released here.
    if (status.ok()) {
      stats = grad_stats_with(options.isa, job.host, p->grad_type, p->count, 1.0F, adam_pool.get());
    }
    if (auto st = store.release(p->grad_host, *lander_stream); !st.ok() && status.ok()) status = st;
  } else if (status.ok()) {
    if (job.first_piece) {
      MutexLock lock(&landing_mu);
      before_grad_write(job.param);
    }
    auto host = store.acquire(p->grad_host, TierKind::kCpu, *lander_stream, AccessMode::kWrite);
    if (!host.ok()) {
      status = host.status();
    } else {
      const uint64_t esize = element_bytes(p->grad_type);
      stats = grad_accumulate_with(options.isa, static_cast<std::byte*>(*host) + job.offset * esize,
                                   job.lease.data(), p->grad_type, job.count, adam_pool.get());
      if (auto st = store.release(p->grad_host, *lander_stream); !st.ok()) status = st;
    }
  }
  job.lease = StagingPool::Lease();
  if (status.ok() && !stats.ok()) status = stats.status();
  {
    MutexLock counters_lock(&state_mu);  // before landing_mu: add_param takes them in this order
    if (job.last_piece) ++counters.grads_landed;
    counters.grad_bytes_landed += job.count * element_bytes(p->grad_type);
  }
  MutexLock lock(&landing_mu);
  Landing& l = landings[job.param];
  if (job.first_piece) {
    l.partial_sq = 0.0;
    l.partial_non_finite = false;
  }
  if (status.ok()) {
    l.partial_sq += stats->grad_sq_sum;
    l.partial_non_finite = l.partial_non_finite || stats->non_finite;
  }
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("gradient of '", p->name,
                                                    "' did not land: ", status.message()));
  }
  return absl::OkStatus();
}

void OffloadOptimizer::Impl::wait_for_landings() {
  MutexLock lock(&landing_mu);
  for (;;) {
    bool busy = !jobs.empty();
    for (const Landing& l : landings) busy = busy || l.pending > 0;
    if (!busy) return;
    wait(&landing_changed, &landing_mu);
  }
}

absl::Status OffloadOptimizer::zero_grad() {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  MutexLock issue(&s.issue_mu);
  s.wait_for_landings();
  // Steps taken early on the gradients being dropped are undone.
  if (auto st = s.roll_back_early(/*rearm=*/false); !st.ok()) return st;
  {
    MutexLock lock(&s.landing_mu);
    for (Impl::Landing& l : s.landings) l = Impl::Landing();
  }
  s.arm();
  return absl::OkStatus();
}

void OffloadOptimizer::wait_for_early_steps() {
  Impl& s = *impl_;
  s.wait_for_landings();
  MutexLock lock(&s.landing_mu);
  while (!s.early_queue.empty() || s.early_running || s.early_claimed) {
    wait(&s.landing_changed, &s.landing_mu);
  }
}

void OffloadOptimizer::set_final_micro_step(bool final) {
  MutexLock lock(&impl_->landing_mu);
  impl_->final_default = final;
}

}  // namespace strata
