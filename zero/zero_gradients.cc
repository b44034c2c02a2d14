// ZeroEngine's gradients: the buffers a trainer adds its gradients into, the reduce-scatter of
// a group as soon as its last gradient is ready (issued on the caller's thread, so that every
// rank issues them in its backward order), and the reducer thread that waits for each one and
// hands the reduced slice to the optimizer — added into its CPU-tier shard (stage 2) or
// announced in place (stage 1).
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <cstring>

#include "strata/base/mutex.h"
#include "zero_engine_impl.h"

namespace strata {

absl::StatusOr<int> ZeroEngine::Impl::take_bucket(uint32_t group) {
  for (;;) {
    if (!failed.ok()) return failed;
    if (stopping) return absl::CancelledError("ZeroEngine: shutting down");
    if (!free_buckets.empty()) {
      const int b = free_buckets.back();
      free_buckets.pop_back();
      return b;
    }
    // Buckets come back when their reduce-scatter has landed. With none in flight, every bucket
    // is held by a group still waiting for gradients: waiting would never end.
    if (reductions.empty() && !reducing) {
      std::string holders;
      for (uint32_t g = 0; g < groups.size(); ++g) {
        if (groups[g].bucket >= 0) absl::StrAppend(&holders, holders.empty() ? "" : ", ", g);
      }
      return absl::ResourceExhaustedError(absl::StrFormat(
          "ZeroEngine: parameter group %d needs a gradient bucket, but all %d are held by groups "
          "still waiting for gradients (%s); announce gradients group by group, in backward "
          "order (acquire_grad then grad_ready), or raise ZeroOptions.gradient_buckets",
          group, buckets.size(), holders));
    }
    wait(&changed, &mu);
  }
}

absl::StatusOr<void*> ZeroEngine::acquire_grad(ZeroParamId id, TierKind tier, Stream& stream) {
  Impl& s = *impl_;
  if (auto st = s.check_param(id); !st.ok()) return st;
  const ZeroSegment& seg = s.layout.param_segment(id.index);
  const std::string& name = s.layout.params()[id.index].name;
  TensorHandle tensor;
  {
    MutexLock lock(&s.mu);
    if (!s.failed.ok()) return s.failed;
    Impl::ParamState& ps = s.param_states[id.index];
    if (ps.acquired) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ZeroEngine::acquire_grad('", name, "'): already acquired; call grad_ready() first"));
    }
    if (ps.ready) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ZeroEngine::acquire_grad('", name,
          "'): its gradient is already ready in this micro-step; the micro-step ends when "
          "every parameter of its group is ready"));
    }
    Impl::Group& g = s.groups[seg.group];
    if (s.options.stage == 1) {
      if (g.completed >= s.options.accumulation_steps) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "ZeroEngine::acquire_grad('%s'): its group has had its %d micro-step(s); call step() "
            "(or zero_grad()) first",
            name, s.options.accumulation_steps));
      }
      tensor = g.grads;
    } else {
      if (g.bucket < 0) {
        const absl::Time start = absl::Now();
        auto b = s.take_bucket(seg.group);
        s.counters.bucket_wait_ns +=
            static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
        if (!b.ok()) return b.status();
        g.bucket = *b;
      }
      tensor = s.buckets[static_cast<size_t>(g.bucket)];
    }
    ps.acquired = true;
    ps.acquired_tensor = tensor;
  }
  auto data = s.runtime.store().acquire(tensor, tier, stream, AccessMode::kWrite);
  if (!data.ok()) {
    MutexLock lock(&s.mu);
    s.param_states[id.index].acquired = false;
    return data.status();
  }
  return static_cast<std::byte*>(*data) + seg.group_offset * s.grad_bytes;
}

absl::Status ZeroEngine::grad_ready(ZeroParamId id, Stream& stream) {
  Impl& s = *impl_;
  if (auto st = s.check_param(id); !st.ok()) return st;
  const ZeroSegment& seg = s.layout.param_segment(id.index);
  TensorHandle tensor;
  {
    MutexLock lock(&s.mu);
    Impl::ParamState& ps = s.param_states[id.index];
    if (!ps.acquired) {
      return absl::FailedPreconditionError(
          absl::StrCat("ZeroEngine::grad_ready('", s.layout.params()[id.index].name,
                       "'): acquire_grad() it first, and add the gradient there"));
    }
    tensor = ps.acquired_tensor;
  }
  absl::Status released = s.runtime.store().release(tensor, stream);
  bool complete = false;
  bool final = false;
  int bucket = -1;
  {
    MutexLock lock(&s.mu);
    Impl::ParamState& ps = s.param_states[id.index];
    ps.acquired = false;
    if (!released.ok()) return released;
    if (!s.failed.ok()) return s.failed;
    ps.ready = true;
    Impl::Group& g = s.groups[seg.group];
    if (++g.ready == g.members) {
      g.ready = 0;
      for (const ZeroSegment& member : s.layout.group_segments(seg.group)) {
        s.param_states[member.param].ready = false;
      }
      ++g.completed;
      final = g.completed == s.options.accumulation_steps;
      complete = s.options.stage >= 2 || final;
      bucket = g.bucket;
      g.bucket = -1;
      uint64_t done = UINT64_MAX;
      for (const Impl::Group& other : s.groups) done = std::min<uint64_t>(done, other.completed);
      s.counters.micro_steps = done;
    }
  }
  if (!complete) return absl::OkStatus();
  // The store orders the reduce-scatter's acquire (on comm_stream) after the work that used
  // the buffer on `stream`.
  return s.issue_reduction(seg.group, bucket, final);
}

absl::Status ZeroEngine::Impl::issue_reduction(uint32_t group, int bucket, bool final) {
  const ZeroFlatGroup& fg = layout.groups()[group];
  Device& device = runtime.device();
  Reduction r;
  r.group = group;
  r.bucket = bucket;
  r.final = final;
  r.tensor = bucket >= 0 ? buckets[static_cast<size_t>(bucket)] : groups[group].grads;
  TensorStore& store = runtime.store();
  // The store orders this acquire (on comm_stream) after the work that wrote the gradients on
  // the trainer's stream; the collective waits for comm_stream, the host waits for neither.
  auto data = store.acquire(r.tensor, comm_tier, *comm_stream,
                            bounce ? AccessMode::kRead : AccessMode::kWrite);
  if (!data.ok()) return fail(data.status());
  auto* base = static_cast<std::byte*>(*data);
  const uint64_t own = static_cast<uint64_t>(rank) * fg.shard * grad_bytes;
  const DataType type = comm_type(options.grad_type);
  absl::StatusOr<std::unique_ptr<CollectiveWork>> work;
  if (!bounce) {
    // In place: this rank's slice of the buffer receives the sum of every rank's slice.
    work = issue(*comm_stream, [&](const CollectiveOptions& co) {
      return comm.reduce_scatter(base, base + own, fg.shard, type, ReduceOp::kSum, co);
    });
    if (!work.ok()) (void)store.release(r.tensor, *comm_stream);
  } else {
    // Through the bounce buffer, once the reducer has read the previous result out of it: the
    // gradients cross to the host on comm_stream, and the tensor is free once they have.
    absl::Status st;
    if (reduce_bounce_free != nullptr)
      st = device.wait_host_flag(*comm_stream, *reduce_bounce_free);
    auto consumed =
        st.ok() ? device.create_host_flag() : absl::StatusOr<std::unique_ptr<HostFlag>>(st);
    auto* host = static_cast<std::byte*>(reduce_bounce->data());
    if (consumed.ok()) {
      st = device.copy_async(host, base, fg.padded * grad_bytes, CopyKind::kDeviceToHost,
                             *comm_stream);
    }
    if (auto released = store.release(r.tensor, *comm_stream); st.ok()) st = released;
    if (!consumed.ok()) return fail(consumed.status());
    // Raised by the reducer once it has read the result; here, if nothing was issued (the
    // engine has failed: comm_stream must not wait for it forever).
    r.consumed = *std::move(consumed);
    reduce_bounce_free = r.consumed;
    if (st.ok()) {
      work = issue(*comm_stream, [&](const CollectiveOptions& co) {
        return comm.reduce_scatter(host, host + own, fg.shard, type, ReduceOp::kSum, co);
      });
      if (!work.ok()) st = work.status();
    }
    if (!st.ok()) {
      (void)device.raise_host_flag(*r.consumed);
      return fail(st);
    }
  }
  if (!work.ok()) return fail(work.status());
  r.work = *std::move(work);
  MutexLock lock(&mu);
  ++counters.reduce_scatters;
  reductions.push_back(std::move(r));
  changed.SignalAll();
  return absl::OkStatus();
}

void ZeroEngine::Impl::run_reducer() {
  for (;;) {
    Reduction r;
    {
      MutexLock lock(&mu);
      while (reductions.empty() && !stopping) wait(&changed, &mu);
      if (reductions.empty()) return;
      r = std::move(reductions.front());
      reductions.pop_front();
      reducing = true;
    }
    absl::Status status = land(r);
    MutexLock lock(&mu);
    reducing = false;
    if (!status.ok() && failed.ok()) failed = status;
    if (r.bucket >= 0) free_buckets.push_back(r.bucket);
    changed.SignalAll();
  }
}

absl::Status ZeroEngine::Impl::land(Reduction& r) {
  TensorStore& store = runtime.store();
  Device& device = runtime.device();
  // The reducer thread waits for the collective on the host; nothing else does.
  absl::Status status = r.work->wait();
  const ZeroFlatGroup& fg = layout.groups()[r.group];
  const ParamId shard = groups[r.group].shard;
  const uint64_t own = static_cast<uint64_t>(rank) * fg.shard * grad_bytes;
  const uint64_t slice = fg.shard * grad_bytes;
  if (bounce) {
    // The reduced slice out of the bounce buffer, which is then free for the next
    // reduce-scatter. Nothing on a device comes between the collective and raising the flag:
    // a stream waits for it, and device work ordered behind that wait only by the host could
    // be queued behind it (cuStreamWaitValue32's caveat). On failure the flag goes up all the
    // same (the engine fails; the content no longer matters).
    if (status.ok()) {
      const auto* host = static_cast<const std::byte*>(reduce_bounce->data());
      reduced.assign(host + own, host + own + slice);
    }
    if (auto st = device.raise_host_flag(*r.consumed); !st.ok() && status.ok()) status = st;
  } else if (auto st = store.release(r.tensor, gloo ? *land_stream : *comm_stream);
             !st.ok() && status.ok()) {
    // The tensor was the collective's, done with it on the host (NCCL's work is ordered on
    // comm_stream: its release is recorded there).
    status = st;
  }
  if (!status.ok()) return status;
  const GradCompletion completion = r.final ? GradCompletion::kFinal : GradCompletion::kMore;
  if (r.bucket < 0 && !bounce) return optimizer->grad_written(shard, completion);  // stage 1
  // The tensor in host memory: stage 1's gradients, where the optimizer reads its slice in
  // place (through the bounce, the slice is copied there); stage 2's bucket, whose slice is
  // added into the optimizer's shard and which is zeroed for the next group (the rest of it
  // holds what the reduce-scatter left). With the bounce, a bucket is zeroed on the device.
  const bool host_write = r.bucket < 0 || !bounce;
  auto data =
      store.acquire(r.tensor, host_write ? host_tier : comm_tier, *land_stream, AccessMode::kWrite);
  if (!data.ok()) return data.status();
  auto* base = static_cast<std::byte*>(*data);
  if (host_write) {
    // The host touches it: a copy into host_tier must have landed.
    if (auto st = device.synchronize(*land_stream); !st.ok()) {
      (void)store.release(r.tensor, *land_stream);
      return st;
    }
  }
  if (r.bucket < 0) {  // stage 1, through the bounce
    std::memcpy(base + own, reduced.data(), slice);
    if (auto st = store.release(r.tensor, *land_stream); !st.ok()) return st;
    return optimizer->grad_written(shard, completion);
  }
  status = optimizer->land_grad(shard, bounce ? reduced.data() : base + own, completion);
  const uint64_t bytes = fg.padded * grad_bytes;
  if (!bounce) {
    std::memset(base, 0, bytes);
  } else {
    absl::Status st =
        device.copy_async(base, zeros->data(), bytes, CopyKind::kHostToDevice, *land_stream);
    if (!st.ok() && status.ok()) status = st;
  }
  if (auto st = store.release(r.tensor, *land_stream); !st.ok() && status.ok()) status = st;
  return status;
}

void ZeroEngine::wait_for_gradients() { impl_->wait_for_reductions(); }

void ZeroEngine::Impl::wait_for_reductions() {
  MutexLock lock(&mu);
  while (!reductions.empty() || reducing) wait(&changed, &mu);
}

absl::Status ZeroEngine::zero_grad() {
  Impl& s = *impl_;
  MutexLock step_lock(&s.step_mu);
  s.wait_for_reductions();
  if (auto st = s.failure(); !st.ok()) return st;
  return s.clear_gradients("zero_grad()");
}

absl::Status ZeroEngine::Impl::clear_gradients(std::string_view caller) {
  {
    MutexLock lock(&mu);
    for (const ParamState& ps : param_states) {
      if (ps.acquired) {
        return absl::FailedPreconditionError(
            absl::StrCat("ZeroEngine::", std::string(caller),
                         ": a gradient buffer is still acquired; grad_ready() it first"));
      }
    }
    for (ParamState& ps : param_states) ps.ready = false;
    for (Group& g : groups) {
      g.ready = 0;
      g.completed = 0;
      if (g.bucket >= 0) free_buckets.push_back(g.bucket);
      g.bucket = -1;
    }
    counters.micro_steps = 0;
  }
  // Stage 1's gradients and buckets a group held without reducing them have gradients in them.
  for (uint32_t g = 0; g < groups.size() && options.stage == 1; ++g) {
    if (auto st = zero_tensor(groups[g].grads, layout.groups()[g].padded * grad_bytes); !st.ok()) {
      return st;
    }
  }
  for (TensorHandle b : buckets) {
    if (auto st = zero_tensor(b, bucket_bytes); !st.ok()) return st;
  }
  return optimizer->zero_grad();
}

}  // namespace strata
