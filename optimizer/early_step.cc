// The overlapped step (options.overlap): a stepper thread runs each unit's Adam — a parameter
// with states in the CPU tier, a chunk with states on NVMe — as soon as its gradient for this
// step is final, while backward goes on. What an early step assumes (no clipping, no overflow,
// the hyper-parameters, loss scale and step counts of arming time, no further landing) is
// checked by step(), which keeps the early work or rolls it back:
//   states in the CPU tier: the unit's states are copied to its backup before Adam touches
//     them; rolling back swaps the backup's tensors in (no copy), and step() steps the unit
//     again;
//   states on NVMe: the new states went to the chunk's uncommitted slot, so rolling back is
//     forgetting them (the same two slots that make a failed write harmless).
// The updated parameter copy is held on the host until step() keeps it: nothing reaches the
// GPU before validation, so the parameters backward still reads are never ahead of the step.
#include <absl/strings/str_cat.h>
#include <absl/time/clock.h>

#include <algorithm>
#include <cstring>

#include "optimizer_impl.h"
#include "strata/base/debug.h"
#include "strata/base/log.h"
#include "strata/base/mutex.h"

namespace strata {
namespace {

uint64_t ns_since(absl::Time start) {
  return static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
}

// Releases what it acquired, on one stream, in reverse.
class Acquired {
 public:
  Acquired(TensorStore& store, Stream& stream) : store_(store), stream_(stream) {}
  ~Acquired() { (void)release(); }
  absl::StatusOr<std::byte*> get(TensorHandle t, TierKind tier, AccessMode mode) {
    auto data = store_.acquire(t, tier, stream_, mode);
    if (!data.ok()) return data.status();
    held_.push_back(t);
    return static_cast<std::byte*>(*data);
  }
  absl::Status release() {
    absl::Status status;
    for (; !held_.empty(); held_.pop_back()) {
      if (auto st = store_.release(held_.back(), stream_); !st.ok() && status.ok()) status = st;
    }
    return status;
  }

 private:
  TensorStore& store_;
  Stream& stream_;
  std::vector<TensorHandle> held_;
};

}  // namespace

void OffloadOptimizer::Impl::arm() {
  if (!options.overlap.enabled) return;
  auto plan = std::make_shared<EarlyPlan>();
  uint64_t units;
  {
    MutexLock lock(&state_mu);
    plan->groups = groups;
    plan->loss_scale = loss_scale;
    const bool cpu = options.state_home == TierKind::kCpu;
    units = cpu ? params.size() : chunks.size();
    plan->params_of_unit.assign(units, {UINT32_MAX, 0});
    for (uint32_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      plan->param_steps.push_back(p.steps);
      const auto first = static_cast<uint32_t>(cpu ? i : p.flat_offset / chunk_elements);
      const auto last =
          static_cast<uint32_t>(cpu ? i : (p.flat_offset + p.count - 1) / chunk_elements);
      plan->units_of_param.emplace_back(first, last);
      for (uint32_t u = first; u <= last; ++u) {
        auto& range = plan->params_of_unit[u];
        range.first = std::min(range.first, i);
        range.second = std::max(range.second, i);
      }
    }
  }
  MutexLock lock(&landing_mu);
  if (const absl::Status armed = overlap.try_arm(); !armed.ok()) {
    STRATA_DCHECK_OK(armed);  // an internal error: the step runs without early work
    STRATA_LOG(kError, "offload optimizer internal error, please report it: %s", armed.message());
    return;
  }
  early_plan = std::move(plan);
  early_units.assign(units, EarlyUnit());
  unit_finals.assign(units, 0);
  for (Landing& l : landings) l.final_seen = false;
  early_ns = 0;
}

void OffloadOptimizer::Impl::retarget_early(std::vector<AdamGroup> now) {
  MutexLock lock(&landing_mu);
  if (!overlap.armed() || early_plan == nullptr || early_plan->groups == now) return;
  // A unit stepping (or about to) reads the plan it took; a stepped one used the old values.
  if (early_running || early_claimed) return;
  for (const EarlyUnit& u : early_units) {
    if (u.state == Early::kStepped || u.state == Early::kStale) return;
  }
  auto plan = std::make_shared<EarlyPlan>(*early_plan);
  plan->groups = std::move(now);
  early_plan = std::move(plan);
}

void OffloadOptimizer::Impl::before_grad_write(uint32_t index) {
  while (early_running && early_busy.first <= index && index <= early_busy.second) {
    wait(&landing_changed, &landing_mu);
  }
  if (!overlap.armed() || index >= early_plan->units_of_param.size()) return;
  Landing& l = landings[index];
  if (!l.final_seen) return;
  l.final_seen = false;
  const auto [first, last] = early_plan->units_of_param[index];
  for (uint32_t u = first; u <= last; ++u) {
    --unit_finals[u];
    EarlyUnit& unit = early_units[u];
    if (unit.state == Early::kQueued) unit.state = Early::kNone;
    if (unit.state == Early::kStepped) unit.state = Early::kStale;
  }
}

void OffloadOptimizer::Impl::note_landing(uint32_t index, bool final) {
  if (!overlap.armed() || !final || index >= early_plan->units_of_param.size()) return;
  Landing& l = landings[index];
  if (l.final_seen) return;
  l.final_seen = true;
  const auto [first, last] = early_plan->units_of_param[index];
  for (uint32_t u = first; u <= last; ++u) {
    const auto [p_first, p_last] = early_plan->params_of_unit[u];
    EarlyUnit& unit = early_units[u];
    if (++unit_finals[u] == p_last - p_first + 1 && unit.state == Early::kNone) {
      unit.state = Early::kQueued;
      unit.order = ++early_order;
      early_queue.push_back(u);
      landing_changed.SignalAll();
    }
  }
}

void OffloadOptimizer::Impl::end_settling() {
  MutexLock lock(&landing_mu);
  if (overlap.phase() != OverlapPhase::Phase::kSettling) return;  // ended already
  const absl::Status settled = overlap.try_settled();
  STRATA_DCHECK_OK(settled);
}

void OffloadOptimizer::Impl::quiesce_stepper() {
  overlap.quiesce();
  for (uint32_t u : early_queue) {
    if (early_units[u].state == Early::kQueued) early_units[u].state = Early::kNone;
  }
  early_queue.clear();
  while (early_running) wait(&landing_changed, &landing_mu);
}

void OffloadOptimizer::Impl::run_stepper() {
  for (;;) {
    uint32_t unit;
    std::shared_ptr<const EarlyPlan> plan;
    {
      MutexLock lock(&landing_mu);
      while (early_queue.empty() && !stopping) wait(&landing_changed, &landing_mu);
      if (stopping) return;
      unit = early_queue.front();
      early_queue.pop_front();
      if (early_units[unit].state != Early::kQueued) {
        landing_changed.SignalAll();  // the queue may be empty now: wait_for_early_steps()
        continue;
      }
      plan = early_plan;
      early_claimed = true;  // off the queue, not running yet: wait_for_early_steps() waits
    }
    // The staging chunk is taken before the unit's gradients are claimed: the lander frees
    // staging chunks and may be waiting to write one of those gradients.
    const bool cpu = options.state_home == TierKind::kCpu;
    StagingPool::Lease lease = cpu ? StagingPool::Lease() : pool->acquire();
    {
      MutexLock lock(&landing_mu);
      if (stopping) return;
      if (early_units[unit].state != Early::kQueued) {  // a landing came in between
        early_claimed = false;
        landing_changed.SignalAll();
        continue;
      }
      plan = early_plan;
      early_busy = plan->params_of_unit[unit];
      early_running = true;
    }
    const absl::Time start = absl::Now();
    bool missed = false;
    const absl::Status status = cpu ? step_param_early(unit, *plan, missed)
                                    : step_chunk_early(unit, *plan, std::move(lease), missed);
    if (missed) {
      MutexLock counters_lock(&state_mu);
      ++counters.overlap_budget_misses;
    }
    MutexLock lock(&landing_mu);
    EarlyUnit& u = early_units[unit];
    // A failed early step is no error of the training step: step() steps the unit as if
    // overlap were off (and meets the cause again, with its message, if it persists).
    if (status.ok() && !missed) {
      u.state = Early::kStepped;
    } else {
      u.state = u.backed_up ? Early::kStale : Early::kNone;
    }
    early_ns += ns_since(start);
    early_running = false;
    early_claimed = false;
    early_busy = {1, 0};
    landing_changed.SignalAll();
  }
}

absl::StatusOr<bool> OffloadOptimizer::Impl::overlap_buffers(uint32_t index, bool backup) {
  Param p;
  {
    MutexLock lock(&state_mu);
    p = params[index];
  }
  const bool cpu = options.state_home == TierKind::kCpu;
  // With states in the CPU tier an fp32 parameter's copy is its master, kept in place.
  const uint64_t copy_bytes =
      cpu && p.param_type == ParamType::kF32 ? 0 : p.count * element_bytes(p.param_type);
  const bool need_backup = backup && !p.backup[0].valid();
  const bool need_copy = copy_bytes > 0 && !p.held_copy.valid();
  const uint64_t want = (need_backup ? 12 * p.count : 0) + (need_copy ? copy_bytes : 0);
  if (want == 0) return true;
  {
    MutexLock lock(&state_mu);
    const uint64_t cap = options.overlap.max_host_bytes;
    if (cap > 0 && counters.overlap_host_bytes + want > cap) return false;
  }
  TensorStore& store = runtime.store();
  std::vector<TensorHandle> made;
  auto give_back = [&] {
    for (TensorHandle t : made) (void)store.destroy(t);
    return false;  // the CPU tier is full: this one steps in step()
  };
  if (need_backup) {
    for (const char* state : {".overlap.master", ".overlap.exp_avg", ".overlap.exp_avg_sq"}) {
      auto t = store.create(absl::StrCat(p.name, state), 4 * p.count, TierKind::kCpu);
      if (!t.ok()) return give_back();
      made.push_back(*t);
    }
  }
  if (need_copy) {
    auto t = store.create(absl::StrCat(p.name, ".overlap.copy"), copy_bytes, TierKind::kCpu);
    if (!t.ok()) return give_back();
    made.push_back(*t);
  }
  MutexLock lock(&state_mu);
  if (need_backup) std::copy(made.begin(), made.begin() + 3, params[index].backup.begin());
  const TensorHandle made_copy = need_copy ? made.back() : TensorHandle();
  if (made_copy.valid()) params[index].held_copy = made_copy;
  counters.overlap_host_bytes += want;
  return true;
}

absl::Status OffloadOptimizer::Impl::step_param_early(uint32_t index, const EarlyPlan& plan,
                                                      bool& missed) {
  auto fits = overlap_buffers(index, /*backup=*/true);
  if (!fits.ok()) return fits.status();
  if (!*fits) {
    missed = true;
    return absl::OkStatus();
  }
  auto p = param_copy(ParamId{index});
  if (!p.ok()) return p.status();
  Acquired held(runtime.store(), *early_stream);
  auto grad = held.get(p->grad_host, p->grad_tier, AccessMode::kRead);
  if (!grad.ok()) return grad.status();
  if (p->grad_tier != TierKind::kCpu) {
    if (auto st = runtime.device().synchronize(*early_stream); !st.ok()) return st;
  }
  std::byte* states[3];
  const TensorHandle handles[3] = {p->master, p->exp_avg, p->exp_avg_sq};
  for (int a = 0; a < 3; ++a) {
    auto data = held.get(handles[a], TierKind::kCpu, AccessMode::kWrite);
    if (!data.ok()) return data.status();
    states[a] = *data;
  }
  std::byte* backups[3];
  for (int a = 0; a < 3; ++a) {
    auto data = held.get(p->backup[a], TierKind::kCpu, AccessMode::kWrite);
    if (!data.ok()) return data.status();
    backups[a] = *data;
  }
  void* copy = nullptr;
  if (p->held_copy.valid()) {
    auto data = held.get(p->held_copy, TierKind::kCpu, AccessMode::kWrite);
    if (!data.ok()) return data.status();
    copy = *data;
  }

  const Piece whole{index, 0, p->count, 0};
  absl::Status status = adam_piece(
      *p, plan.groups[p->group], plan.param_steps[index] + 1, unclipped_grad_scale(plan.loss_scale),
      whole, *grad + p->grad_offset, reinterpret_cast<float*>(states[0]),
      reinterpret_cast<float*>(states[1]), reinterpret_cast<float*>(states[2]), copy,
      std::array<float*, 3>{reinterpret_cast<float*>(backups[0]),
                            reinterpret_cast<float*>(backups[1]),
                            reinterpret_cast<float*>(backups[2])});
  if (status.ok()) {
    // The kernel copied every chunk into the backups before stepping it (it refuses bad input
    // before touching anything, so a failed call changed nothing and needs no restore).
    MutexLock lock(&landing_mu);
    early_units[index].backed_up = true;
  }
  if (auto st = held.release(); !st.ok() && status.ok()) status = st;
  return status;
}

absl::Status OffloadOptimizer::Impl::step_chunk_early(uint32_t chunk, const EarlyPlan& plan,
                                                      StagingPool::Lease lease, bool& missed) {
  const auto [p_first, p_last] = plan.params_of_unit[chunk];
  for (uint32_t i = p_first; i <= p_last; ++i) {
    auto fits = overlap_buffers(i, /*backup=*/false);
    if (!fits.ok()) return fits.status();
    if (!*fits) {
      missed = true;
      return absl::OkStatus();
    }
  }
  const std::vector<Param> all = params_snapshot();
  const std::vector<Piece> pieces = chunk_pieces(chunk, all, nullptr);
  const uint32_t slot = current_slot(chunk);
  const uint64_t stride = chunk_stride(chunk);
  Completion read;
  absl::Status status = read_chunk(chunk, slot, lease.data(), read);
  if (!status.ok()) read.signal(status);
  if (auto st = read.wait(); !st.ok()) return st;
  auto* base = static_cast<float*>(lease.data());
  auto* copies = reinterpret_cast<std::byte*>(base + 3 * stride);
  Acquired held(runtime.store(), *early_stream);
  uint32_t open = UINT32_MAX;
  const std::byte* grad = nullptr;
  std::byte* held_copy = nullptr;
  for (const Piece& piece : pieces) {
    const Param& p = all[piece.param];
    if (piece.param != open) {
      if (status = held.release(); !status.ok()) break;
      auto g = held.get(p.grad_host, p.grad_tier, AccessMode::kRead);
      auto c = g.ok() ? held.get(p.held_copy, TierKind::kCpu, AccessMode::kWrite) : g;
      if (!c.ok()) {
        status = c.status();
        break;
      }
      if (p.grad_tier != TierKind::kCpu) {
        if (status = runtime.device().synchronize(*early_stream); !status.ok()) break;
      }
      grad = *g + p.grad_offset;
      held_copy = *c;
      open = piece.param;
    }
    float* master = base + piece.chunk_offset;
    void* copy = copies + piece.chunk_offset * 2;
    status = adam_piece(p, plan.groups[p.group], plan.param_steps[piece.param] + 1,
                        unclipped_grad_scale(plan.loss_scale), piece, grad, master, master + stride,
                        master + 2 * stride, copy);
    if (!status.ok()) break;
    // Held as the GPU will get it: fp32 parameters are their master.
    const uint64_t esize = element_bytes(p.param_type);
    std::memcpy(held_copy + piece.offset * esize,
                p.param_type == ParamType::kF32 ? static_cast<const void*>(master) : copy,
                piece.count * esize);
  }
  if (auto st = held.release(); !st.ok() && status.ok()) status = st;
  if (!status.ok()) return status;
  // The other slot: committed only if step() keeps this work.
  Completion written;
  status = write_chunk(chunk, slot ^ 1U, lease.data(), written);
  if (!status.ok()) written.signal(status);
  return written.wait();
}

absl::StatusOr<OffloadOptimizer::Impl::EarlyOutcome> OffloadOptimizer::Impl::settle_early(
    bool valid) {
  EarlyOutcome out;
  std::vector<uint32_t> rolled;
  std::vector<uint32_t> restore;
  std::vector<std::pair<uint64_t, uint32_t>> kept;  // (order, unit)
  {
    MutexLock lock(&landing_mu);
    quiesce_stepper();
    out.early_ns = early_ns;
    for (uint32_t u = 0; u < early_units.size(); ++u) {
      EarlyUnit& unit = early_units[u];
      if (unit.state == Early::kStepped && valid) {
        kept.emplace_back(unit.order, u);
      } else if (unit.state == Early::kStepped || unit.state == Early::kStale) {
        rolled.push_back(u);
        if (unit.backed_up) restore.push_back(u);
      }
      unit = EarlyUnit();
    }
  }
  out.rolled_back = !rolled.empty();
  // Forward order: the unit whose gradient came last (the first layers) first.
  std::sort(kept.begin(), kept.end(), std::greater<>());
  for (const auto& [order, u] : kept) out.kept.push_back(u);
  const bool cpu = options.state_home == TierKind::kCpu;
  const std::vector<Param> all = params_snapshot();
  auto unit_elements = [&](uint32_t u) {
    if (cpu) return all[u].count;
    uint64_t n = 0;
    for (const Piece& piece : chunk_pieces(u, all, nullptr)) n += piece.count;
    return n;
  };
  for (uint32_t u : out.kept) out.kept_elements += unit_elements(u);
  for (uint32_t u : rolled) out.redone_elements += unit_elements(u);
  // Restoring is swapping: the backups hold the states from before the early step, and become
  // the states; the early-stepped ones become the backups (overwritten by the next early step).
  // Nothing holds a state acquired now (the stepper is quiet; step_mu is held).
  const absl::Time start = absl::Now();
  {
    MutexLock lock(&state_mu);
    for (uint32_t u : restore) {
      Param& p = params[u];
      std::swap(p.master, p.backup[0]);
      std::swap(p.exp_avg, p.backup[1]);
      std::swap(p.exp_avg_sq, p.backup[2]);
    }
  }
  out.rollback_ns = ns_since(start);
  return out;
}

absl::Status OffloadOptimizer::Impl::roll_back_early(bool rearm) {
  if (!options.overlap.enabled) return absl::OkStatus();
  auto outcome = settle_early(/*valid=*/false);
  if (rearm) arm();
  return outcome.ok() ? absl::OkStatus() : outcome.status();
}

absl::Status OffloadOptimizer::Impl::upload_kept(const EarlyOutcome& kept,
                                                 std::vector<uint64_t>& written) {
  TensorStore& store = runtime.store();
  Device& device = runtime.device();
  const bool cpu = options.state_home == TierKind::kCpu;
  const std::vector<Param> all = params_snapshot();
  auto upload = [&](const Param& p, uint64_t offset, uint64_t count) -> absl::Status {
    const bool from_master = cpu && p.param_type == ParamType::kF32;
    const uint64_t esize = element_bytes(p.param_type);
    Acquired held(store, *h2d_stream);
    auto src = held.get(from_master ? p.master : p.held_copy, TierKind::kCpu, AccessMode::kRead);
    if (!src.ok()) return src.status();
    auto dst = held.get(p.param, TierKind::kGpu, AccessMode::kWrite);
    if (!dst.ok()) return dst.status();
    absl::Status st =
        device.copy_async(*dst + p.param_offset + offset * esize, *src + offset * esize,
                          count * esize, CopyKind::kHostToDevice, *h2d_stream);
    // Released on the stream: the copy is what used them.
    if (auto r = held.release(); !r.ok() && st.ok()) st = r;
    return st;
  };
  for (uint32_t u : kept.kept) {
    if (cpu) {
      if (auto st = upload(all[u], 0, all[u].count); !st.ok()) return st;
      continue;
    }
    for (const Piece& piece : chunk_pieces(u, all, nullptr)) {
      if (auto st = upload(all[piece.param], piece.offset, piece.count); !st.ok()) return st;
    }
    written.push_back(u);
  }
  return absl::OkStatus();
}

}  // namespace strata
