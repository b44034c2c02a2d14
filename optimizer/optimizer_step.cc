// OffloadOptimizer::step(): clipping and overflow from the statistics gathered as gradients
// landed, then the chunk pipeline — CPU Adam on chunk k+1 while chunk k's updated parameters
// are copied to the GPU, and with states on NVMe the read of chunk k+1 and the write of chunk
// k-1 around the step of chunk k.
#include <absl/cleanup/cleanup.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/time/clock.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "optimizer_impl.h"
#include "strata/base/mutex.h"

namespace strata {
namespace {

using Param = OffloadOptimizer::Impl::Param;

uint64_t since_ns(absl::Time start) {
  return static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
}

// Holds one parameter's tensors acquired for as long as consecutive pieces use it: pieces come
// in flat order, so each parameter is acquired once per step.
class OpenParam {
 public:
  // A gradient read in place from a tier other than the CPU's (GradSource::kView) is acquired on
  // `view_stream`, which is synchronized before the host reads it: its copy into that tier may
  // still be running (the CPU tier's acquire waits by itself).
  OpenParam(Device& device, TensorStore& store, Stream& stream, Stream& view_stream,
            const std::vector<Param>& params, bool cpu_states)
      : device_(device),
        store_(store),
        stream_(stream),
        view_stream_(view_stream),
        params_(params),
        cpu_states_(cpu_states) {}
  ~OpenParam() { (void)close(); }

  // Acquires `param`'s GPU copy (written by the H2D copies), its landed gradient and, with
  // states in the CPU tier, its states.
  absl::Status open(uint32_t param) {
    if (open_ && param_ == param) return absl::OkStatus();
    if (auto st = close(); !st.ok()) return st;
    const Param& p = params_[param];
    param_ = param;
    open_ = true;
    struct Want {
      TensorHandle tensor;
      TierKind tier;
      AccessMode mode;
      void** out;
      Stream* stream;
    };
    Stream* grad_stream = p.grad_tier == TierKind::kCpu ? &stream_ : &view_stream_;
    std::vector<Want> wants = {{p.grad_host, p.grad_tier, AccessMode::kRead, &grad_, grad_stream},
                               {p.param, TierKind::kGpu, AccessMode::kWrite, &gpu_, &stream_}};
    if (cpu_states_) {
      wants.push_back({p.master, TierKind::kCpu, AccessMode::kWrite, &master_, &stream_});
      wants.push_back({p.exp_avg, TierKind::kCpu, AccessMode::kWrite, &exp_avg_, &stream_});
      wants.push_back({p.exp_avg_sq, TierKind::kCpu, AccessMode::kWrite, &exp_avg_sq_, &stream_});
    }
    for (const Want& w : wants) {
      auto data = store_.acquire(w.tensor, w.tier, *w.stream, w.mode);
      if (!data.ok()) return data.status();
      *w.out = *data;
      held_.push_back({w.tensor, w.stream});
    }
    if (grad_stream != &stream_) {
      if (auto st = device_.synchronize(*grad_stream); !st.ok()) return st;
    }
    grad_ = static_cast<std::byte*>(grad_) + p.grad_offset;
    gpu_ = static_cast<std::byte*>(gpu_) + p.param_offset;
    return absl::OkStatus();
  }

  // Releases in reverse; work issued on the stream so far is what used them.
  absl::Status close() {
    absl::Status status;
    while (!held_.empty()) {
      const auto [tensor, stream] = held_.back();
      if (auto st = store_.release(tensor, *stream); !st.ok() && status.ok()) status = st;
      held_.pop_back();
    }
    open_ = false;
    return status;
  }

  std::byte* grad() const { return static_cast<std::byte*>(grad_); }
  std::byte* gpu() const { return static_cast<std::byte*>(gpu_); }
  float* master() const { return static_cast<float*>(master_); }
  float* exp_avg() const { return static_cast<float*>(exp_avg_); }
  float* exp_avg_sq() const { return static_cast<float*>(exp_avg_sq_); }

 private:
  Device& device_;
  TensorStore& store_;
  Stream& stream_;
  Stream& view_stream_;
  const std::vector<Param>& params_;
  const bool cpu_states_;
  bool open_ = false;
  uint32_t param_ = 0;
  std::vector<std::pair<TensorHandle, Stream*>> held_;
  void* grad_ = nullptr;
  void* gpu_ = nullptr;
  void* master_ = nullptr;
  void* exp_avg_ = nullptr;
  void* exp_avg_sq_ = nullptr;
};

// What every piece's Adam call shares in one step.
struct StepPlan {
  std::vector<Param> params;
  std::vector<AdamGroup> groups;
  std::vector<bool> landed;       // stepped here (overlap: less the parameters stepped early)
  std::vector<bool> skip_chunks;  // states on NVMe: chunks stepped early (empty: none)
  float grad_scale = 1.0F;
};

absl::Status adam_piece(const OffloadOptimizer::Impl& s, const StepPlan& plan, const Piece& piece,
                        const std::byte* grad, float* master, float* exp_avg, float* exp_avg_sq,
                        void* copy) {
  const Param& p = plan.params[piece.param];
  return s.adam_piece(p, plan.groups[p.group], p.steps + 1, plan.grad_scale, piece, grad, master,
                      exp_avg, exp_avg_sq, copy);
}

}  // namespace

// States in the CPU tier: chunks of landed parameters' elements; two staging chunks alternate
// as the destination of the parameter copies, so the H2D copies of one chunk overlap the step
// of the next.
static absl::Status step_cpu_states(OffloadOptimizer::Impl& s, const StepPlan& plan,
                                    uint64_t& adam_ns) {
  Device& device = s.runtime.device();
  std::vector<std::vector<Piece>> chunks(1);
  uint64_t filled = 0;
  for (uint32_t i = 0; i < plan.params.size(); ++i) {
    if (!plan.landed[i]) continue;
    for (uint64_t offset = 0; offset < plan.params[i].count;) {
      if (filled == s.chunk_elements) {
        chunks.emplace_back();
        filled = 0;
      }
      const uint64_t n = std::min(plan.params[i].count - offset, s.chunk_elements - filled);
      chunks.back().push_back(Piece{i, offset, n, filled});
      offset += n;
      filled += n;
    }
  }
  StagingPool::Lease leases[2] = {s.pool->acquire(), s.pool->acquire()};
  std::unique_ptr<Event> copied[2];
  for (auto& e : copied) {
    auto created = device.create_event();
    if (!created.ok()) return created.status();
    e = *std::move(created);
  }
  {
    MutexLock lock(&s.state_mu);
    s.counters.peak_staging_chunks = std::max<uint64_t>(s.counters.peak_staging_chunks, 2);
  }
  OpenParam open(device, s.runtime.store(), *s.h2d_stream, *s.d2h_stream, plan.params,
                 /*cpu_states=*/true);
  absl::Status status;
  for (uint64_t k = 0; k < chunks.size() && status.ok(); ++k) {
    const uint32_t slot = k % 2;
    if (k >= 2) status = device.synchronize(*copied[slot]);  // its copies read this lease
    auto* buffer = static_cast<std::byte*>(leases[slot].data());
    for (const Piece& piece : chunks[k]) {
      if (!status.ok()) break;
      status = open.open(piece.param);
      if (!status.ok()) break;
      const Param& p = plan.params[piece.param];
      const uint64_t esize = element_bytes(p.param_type);
      void* copy = buffer + piece.chunk_offset * 2;
      const absl::Time start = absl::Now();
      status = adam_piece(s, plan, piece, open.grad(), open.master() + piece.offset,
                          open.exp_avg() + piece.offset, open.exp_avg_sq() + piece.offset, copy);
      adam_ns += since_ns(start);
      if (!status.ok()) break;
      // fp32 parameters are the master itself, still acquired while this copy is issued.
      const void* src = p.param_type == ParamType::kF32 ? open.master() + piece.offset : copy;
      status = device.copy_async(open.gpu() + piece.offset * esize, src, piece.count * esize,
                                 CopyKind::kHostToDevice, *s.h2d_stream);
    }
    if (status.ok()) status = device.record(*copied[slot], *s.h2d_stream);
  }
  if (auto st = open.close(); !st.ok() && status.ok()) status = st;
  // The leases go back to the pool: their copies must be done.
  if (auto st = device.synchronize(*s.h2d_stream); !st.ok() && status.ok()) status = st;
  return status;
}

namespace {

// A chunk in flight through the NVMe pipeline. Completions are signalled by I/O threads, so
// a Flight stays put (held by unique_ptr) until both have been waited for.
struct Flight {
  uint64_t chunk = 0;
  uint32_t read_slot = 0;
  uint64_t stride = 0;  // elements of each state array in the chunk's slots
  StagingPool::Lease lease;
  Completion read;
  Completion write;
  bool read_issued = false;
  bool write_issued = false;
  bool uploaded = false;  // H2D copies issued
  std::unique_ptr<Event> copied;
  std::vector<Piece> pieces;
};

}  // namespace

// States on NVMe: read chunk k+1 while stepping chunk k while writing chunk k-1, within three
// staging chunks. New states go to each chunk's other slot; the caller commits them.
static absl::Status step_nvme_states(OffloadOptimizer::Impl& s, const StepPlan& plan,
                                     std::vector<uint64_t>& written, uint64_t& adam_ns,
                                     uint64_t& io_wait_ns, bool& restored) {
  Device& device = s.runtime.device();
  uint64_t total_chunks;
  {
    MutexLock lock(&s.state_mu);
    total_chunks = s.chunks.size();
  }
  std::vector<std::unique_ptr<Flight>> flights;
  for (uint64_t c = 0; c < total_chunks; ++c) {
    if (c < plan.skip_chunks.size() && plan.skip_chunks[c]) continue;
    auto pieces = s.chunk_pieces(c, plan.params, &plan.landed);
    if (pieces.empty()) continue;
    auto f = std::make_unique<Flight>();
    f->chunk = c;
    f->read_slot = s.current_slot(c);
    f->stride = s.chunk_stride(c);
    f->pieces = std::move(pieces);
    flights.push_back(std::move(f));
  }
  OpenParam open(device, s.runtime.store(), *s.h2d_stream, *s.d2h_stream, plan.params,
                 /*cpu_states=*/false);
  uint64_t leases_out = 0;
  uint64_t held = 0;
  auto issue_read = [&](Flight& f) -> absl::Status {
    f.lease = s.pool->acquire();
    held = std::max(held, ++leases_out);
    f.read_issued = true;
    absl::Status st = s.read_chunk(f.chunk, f.read_slot, f.lease.data(), f.read);
    if (!st.ok()) f.read.signal(st);
    return st;
  };
  auto waited = [&](Completion& c) {
    const absl::Time start = absl::Now();
    absl::Status st = c.wait();
    io_wait_ns += since_ns(start);
    return st;
  };
  // Waits for everything chunk f still has in flight and returns its lease.
  auto retire = [&](Flight& f) -> absl::Status {
    absl::Status st;
    if (f.read_issued) {
      if (auto r = waited(f.read); !r.ok()) st = r;
    }
    if (f.write_issued) {
      if (auto w = waited(f.write); !w.ok() && st.ok()) st = w;
    }
    if (f.uploaded) {
      if (auto c = device.synchronize(*f.copied); !c.ok() && st.ok()) st = c;
    }
    if (f.lease) --leases_out;
    f.lease = StagingPool::Lease();
    return st;
  };
  absl::Status status;
  uint64_t retired = 0;
  if (!flights.empty()) status = issue_read(*flights[0]);
  for (uint64_t k = 0; k < flights.size() && status.ok(); ++k) {
    if (k >= 2) {  // chunk k-2 frees its lease before chunk k+1 takes one
      status = retire(*flights[k - 2]);
      retired = k - 1;
      if (!status.ok()) break;
    }
    if (k + 1 < flights.size()) {
      status = issue_read(*flights[k + 1]);
      if (!status.ok()) break;
    }
    Flight& f = *flights[k];
    status = waited(f.read);
    if (!status.ok()) break;
    auto* base = static_cast<float*>(f.lease.data());
    const uint64_t e = f.stride;
    auto* copies = reinterpret_cast<std::byte*>(base + 3 * e);
    for (const Piece& piece : f.pieces) {
      status = open.open(piece.param);
      if (!status.ok()) break;
      const Param& p = plan.params[piece.param];
      float* master = base + piece.chunk_offset;
      void* copy = copies + piece.chunk_offset * 2;
      const absl::Time start = absl::Now();
      status = adam_piece(s, plan, piece, open.grad(), master, master + e, master + 2 * e, copy);
      adam_ns += since_ns(start);
      if (!status.ok()) break;
      const uint64_t esize = element_bytes(p.param_type);
      const void* src = p.param_type == ParamType::kF32 ? static_cast<void*>(master) : copy;
      f.uploaded = true;
      status = device.copy_async(open.gpu() + piece.offset * esize, src, piece.count * esize,
                                 CopyKind::kHostToDevice, *s.h2d_stream);
      if (!status.ok()) break;
    }
    if (f.uploaded) {
      auto event = device.create_event();
      absl::Status st = event.ok() ? device.record(**event, *s.h2d_stream) : event.status();
      if (st.ok()) {
        f.copied = *std::move(event);
      } else {
        f.uploaded = false;  // nothing to wait on per chunk: synchronise the stream below
        (void)device.synchronize(*s.h2d_stream);
        if (status.ok()) status = st;
      }
    }
    if (!status.ok()) break;
    f.write_issued = true;
    status = s.write_chunk(f.chunk, f.read_slot ^ 1U, f.lease.data(), f.write);
    if (!status.ok()) f.write.signal(status);
  }
  if (auto st = open.close(); !st.ok() && status.ok()) status = st;
  // Everything still in flight must finish before its lease and completions go away.
  for (uint64_t k = retired; k < flights.size(); ++k) {
    if (auto st = retire(*flights[k]); !st.ok() && status.ok()) status = st;
  }
  {
    MutexLock lock(&s.state_mu);
    s.counters.peak_staging_chunks = std::max(s.counters.peak_staging_chunks, held);
  }
  if (status.ok()) {
    for (const auto& f : flights) written.push_back(f->chunk);
    return status;
  }
  // Failed: the committed slots still hold the previous states. Put the previous parameters
  // back where an updated chunk was already copied to the GPU.
  std::vector<uint64_t> restore_errors;
  for (const auto& f : flights) {
    if (!f->uploaded) continue;
    StagingPool::Lease lease = s.pool->acquire();
    Completion read;
    absl::Status st = s.read_chunk(f->chunk, f->read_slot, lease.data(), read);
    st = st.ok() ? read.wait() : st;
    for (const Piece& piece : f->pieces) {
      if (!st.ok()) break;
      st = s.write_param_tensor(plan.params[piece.param], piece.offset,
                                static_cast<const float*>(lease.data()) + piece.chunk_offset,
                                piece.count);
    }
    if (!st.ok()) restore_errors.push_back(f->chunk);
  }
  restored = restore_errors.empty();
  if (!restore_errors.empty()) {
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), "; restoring the previous parameters of ",
                                     restore_errors.size(),
                                     " chunk(s) failed as well: the "
                                     "parameters are partly updated, load() a checkpoint"));
  }
  return status;
}

absl::StatusOr<StepResult> OffloadOptimizer::Impl::step() {
  const absl::Time start = absl::Now();
  wait_for_landings();
  const uint64_t wait_ns = since_ns(start);
  // Overlap: no early step starts from here on; the one running finishes.
  uint64_t early_wait_ns = 0;
  std::shared_ptr<const EarlyPlan> early;
  if (options.overlap.enabled) {
    const absl::Time quiet = absl::Now();
    MutexLock lock(&landing_mu);
    early = early_plan;
    overlap.begin_settling();
    quiesce_stepper();
    early_wait_ns = since_ns(quiet);
  }
  // Nothing arms until this step has set the next one's loss scale (end_settling() below, before
  // each arm()); a return without arming ends the settling here.
  const absl::Cleanup end_settling_on_return = [this] { end_settling(); };
  StepPlan plan;
  plan.params = params_snapshot();
  float scale;
  {
    MutexLock lock(&state_mu);
    plan.groups = groups;
    scale = loss_scale;
  }
  plan.landed.assign(plan.params.size(), false);
  double sq_sum = 0.0;
  bool non_finite = false;
  uint64_t updated = 0;
  {
    MutexLock lock(&landing_mu);
    for (size_t i = 0; i < plan.params.size(); ++i) {
      const Landing& l = landings[i];
      if (!l.failed.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step: ", l.failed.message(), " — call zero_grad() and run backward again"));
      }
      if (l.landed == 0) continue;
      plan.landed[i] = true;
      ++updated;
      sq_sum += l.sq_sum;
      non_finite = non_finite || l.non_finite;
    }
  }
  // Early work that step() does not keep is rolled back before any return, so that the states
  // are the previous step's whenever step() does not complete.
  auto roll_back = [&]() -> absl::Status {
    auto outcome = settle_early(/*valid=*/false);
    return outcome.ok() ? absl::OkStatus() : outcome.status();
  };
  if (options.combine_grad_stats) {
    // Collective under data parallelism: every rank gets here every step, also with nothing
    // landed, so that the ranks' calls match.
    auto combined = options.combine_grad_stats(GradStatistics{sq_sum, non_finite});
    if (!combined.ok()) {
      absl::Status rolled = roll_back();
      return absl::Status(
          combined.status().code(),
          absl::StrCat(
              "step: combining the gradient statistics of the ranks: ", combined.status().message(),
              rolled.ok() ? ""
                          : absl::StrCat("; rolling back the early steps: ", rolled.message())));
    }
    sq_sum = combined->sq_sum;
    non_finite = combined->non_finite;
  }
  StepResult result;
  result.loss_scale = scale;
  const double divisor = static_cast<double>(scale) * options.grad_divisor;
  result.grad_norm = std::sqrt(sq_sum) / divisor;
  result.params_updated = updated;
  auto clear_landings = [&] {
    MutexLock lock(&landing_mu);
    for (Landing& l : landings) l = Landing();
  };
  const LossScaling& ls = options.loss_scaling;
  if (non_finite && options.skip_on_overflow) {
    auto undone = settle_early(/*valid=*/false);
    if (!undone.ok()) return undone.status();
    clear_landings();
    {
      // The scale backs off before arm() (end_settling() first: OverlapPhase refuses the other
      // order): the next step's early work reads the scale that step will use.
      MutexLock lock(&state_mu);
      if (ls.dynamic) loss_scale = std::max(ls.min_scale, loss_scale * ls.backoff_factor);
      good_steps = 0;
    }
    end_settling();
    arm();
    MutexLock lock(&state_mu);
    ++counters.skipped_steps;
    if (undone->rolled_back) ++counters.overlap_rollbacks;
    result.skipped = true;
    result.params_updated = 0;
    result.grad_norm = std::numeric_limits<double>::infinity();
    result.step = step_count;
    result.loss_scale = loss_scale;
    result.rolled_back = undone->rolled_back;
    // This step's figures, as a completed step records them: nothing kept, nothing stepped
    // again (the early work is undone and the step skipped).
    counters.last_step_ns = since_ns(start);
    counters.last_step_wait_ns = wait_ns;
    counters.last_adam_ns = 0;
    counters.last_nvme_wait_ns = 0;
    counters.last_early_elements = 0;
    counters.last_redone_elements = 0;
    counters.last_early_adam_ns = undone->early_ns;
    counters.last_rollback_ns = undone->rollback_ns;
    counters.last_early_wait_ns = early_wait_ns;
    return result;
  }
  if (updated == 0) {
    if (auto st = roll_back(); !st.ok()) return st;
    end_settling();
    arm();
    MutexLock lock(&state_mu);
    result.step = step_count;
    return result;
  }
  if (options.max_grad_norm > 0 && std::isfinite(result.grad_norm)) {
    result.clip_coef = std::min(1.0, options.max_grad_norm / (result.grad_norm + 1e-6));
  }
  plan.grad_scale = static_cast<float>(result.clip_coef / divisor);

  // Early work holds when it stepped with exactly what this step uses.
  const bool early_valid = early != nullptr && result.clip_coef == 1.0 &&
                           early->loss_scale == scale && early->groups == plan.groups;
  EarlyOutcome outcome;
  if (options.overlap.enabled) {
    auto settled = settle_early(early_valid);
    if (!settled.ok()) return settled.status();
    outcome = *std::move(settled);
    plan.params = params_snapshot();  // a rollback swapped state tensors
  }
  const std::vector<bool> landed = plan.landed;
  for (uint32_t u : outcome.kept) {
    if (options.state_home == TierKind::kCpu) {
      plan.landed[u] = false;
    } else {
      plan.skip_chunks.resize(std::max<size_t>(plan.skip_chunks.size(), u + 1), false);
      plan.skip_chunks[u] = true;
    }
  }

  uint64_t adam_ns = 0;
  uint64_t io_wait_ns = 0;
  std::vector<uint64_t> written;
  bool restored = false;
  absl::Status status = options.state_home == TierKind::kCpu
                            ? step_cpu_states(*this, plan, adam_ns)
                            : step_nvme_states(*this, plan, written, adam_ns, io_wait_ns, restored);
  // The parameters stepped early go up after the rest: they are the last layers, which the
  // next forward needs last.
  if (status.ok()) status = upload_kept(outcome, written);
  // step_mu is held: nothing observes the slots between this commit and the counts below.
  if (status.ok()) commit_slots(written);
  {
    MutexLock lock(&state_mu);
    counters.last_step_ns = since_ns(start);
    counters.last_step_wait_ns = wait_ns;
    counters.last_adam_ns = adam_ns;
    counters.last_nvme_wait_ns = io_wait_ns;
    counters.last_early_elements = outcome.kept_elements;
    counters.last_redone_elements = outcome.redone_elements;
    counters.last_early_adam_ns = outcome.early_ns;
    counters.last_rollback_ns = outcome.rollback_ns;
    counters.last_early_wait_ns = early_wait_ns;
    if (!status.ok()) {
      ++counters.failed_steps;
      return absl::Status(
          status.code(),
          absl::StrCat("optimizer step ", step_count + 1, " failed: ", status.message(),
                       restored ? "; the states and parameters are those of the previous step "
                                  "and the gradients are kept: fix the cause and call step() "
                                  "again"
                                : "; states in the CPU tier were updated in place up to the "
                                  "failure: load() the last checkpoint"));
    }
    for (size_t i = 0; i < params.size() && i < landed.size(); ++i) {
      if (landed[i]) ++params[i].steps;
    }
    ++step_count;
    ++counters.steps;
    if (!outcome.kept.empty()) ++counters.overlap_early_steps;
    if (outcome.rolled_back) ++counters.overlap_rollbacks;
    if (ls.dynamic && ++good_steps >= ls.growth_interval) {
      loss_scale *= ls.growth_factor;
      good_steps = 0;
    }
    result.step = step_count;
    result.loss_scale = loss_scale;
    result.early_elements = outcome.kept_elements;
    result.rolled_back = outcome.rolled_back;
  }
  clear_landings();
  {
    MutexLock lock(&landing_mu);
    final_default = true;
  }
  end_settling();
  arm();
  return result;
}

}  // namespace strata
