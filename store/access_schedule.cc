// AccessSchedule: the trace is a cycle of n entries (entry i is followed by (i + 1) % n, the last
// one by the next step's first). `cursor` is the trace index of the next expected access and
// `position` its absolute position; every distance is taken from there, so the absolute numbers
// only need to grow, not to stay equal to step * n + index after a realignment.
#include "strata/store/access_schedule.h"

#include <absl/container/flat_hash_map.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "strata/base/debug.h"
#include "strata/base/log.h"

namespace strata {
namespace {

uint64_t access_key(Access access) {
  return (static_cast<uint64_t>(access.tensor) << 8) | static_cast<uint64_t>(access.tier);
}
TensorId key_tensor(uint64_t key) { return static_cast<TensorId>(key >> 8); }

// Leads are keyed by the access and its occurrence within the step, not by trace index, so a
// re-recorded trace that differs elsewhere keeps what late arrivals taught.
using LeadKey = std::pair<uint64_t, uint32_t>;

// A trace entry found for an acquire, and how far from the cursor it is.
struct Match {
  size_t index = 0;
  size_t offset = 0;  // entries skipped ahead, or entries behind the cursor
  bool ahead = true;
};

}  // namespace

struct AccessSchedule::State {
  explicit State(AccessScheduleOptions opts) : options(opts) {}

  AccessScheduleOptions options;
  AccessScheduleStats stats;

  std::vector<Access> trace;
  std::vector<uint32_t> occurrence;  // per entry: earlier entries of the same access
  std::vector<uint32_t> lead;        // per entry: positions ahead its prefetch is due
  absl::flat_hash_map<TensorId, std::vector<size_t>> uses;  // sorted entry indices per tensor
  absl::flat_hash_map<LeadKey, uint32_t> leads;             // outlives any one trace

  size_t cursor = 0;
  uint64_t position = 0;
  std::optional<size_t> last;  // entry the latest acquire matched: what on_late refers to

  bool in_step = false;
  bool step_differs = false;    // realigned or met an unknown access
  bool step_discarded = false;  // set_order() came mid-step: this step neither records nor compares
  std::vector<Access> recording;

  uint64_t tick = 0;
  absl::flat_hash_map<TensorId, uint64_t> recency;

  void install(std::vector<Access> new_trace) {
    trace = std::move(new_trace);
    const size_t n = trace.size();
    occurrence.assign(n, 0);
    lead.assign(n, options.initial_lead);
    uses.clear();
    absl::flat_hash_map<uint64_t, uint32_t> seen;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t key = access_key(trace[i]);
      occurrence[i] = seen[key]++;
      if (auto it = leads.find(LeadKey{key, occurrence[i]}); it != leads.end()) {
        lead[i] = it->second;
      }
      uses[trace[i].tensor].push_back(i);
    }
    cursor = 0;
    last.reset();
  }

  // The nearest entry equal to `access` within realign_window of the cursor, ahead preferred on
  // ties. Walks the tensor's sorted uses outward from the cursor, so it costs O(log n) plus the
  // uses of this tensor in other tiers that lie closer.
  std::optional<Match> find_nearest(Access access) const {
    const auto it = uses.find(access.tensor);
    if (it == uses.end()) return std::nullopt;
    const std::vector<size_t>& indices = it->second;
    const size_t n = trace.size();
    const size_t count = indices.size();
    const size_t window = options.realign_window;
    const size_t start = static_cast<size_t>(
        std::lower_bound(indices.begin(), indices.end(), cursor) - indices.begin());

    // Offsets grow monotonically along each walk (wrapping included), so stop at the window.
    std::optional<Match> ahead;
    for (size_t k = 0; k < count; ++k) {
      const size_t i = indices[(start + k) % count];
      const size_t offset = (i + n - cursor) % n;
      if (offset > window) break;
      if (trace[i] == access) {
        ahead = Match{i, offset, true};
        break;
      }
    }
    std::optional<Match> behind;
    for (size_t k = 1; k <= count; ++k) {
      const size_t i = indices[(start + count - k) % count];
      const size_t offset = (cursor + n - i) % n;
      if (offset == 0) continue;  // the cursor itself: the ahead walk saw it
      if (offset > window) break;
      if (trace[i] == access) {
        behind = Match{i, offset, false};
        break;
      }
    }
    if (ahead && (!behind || ahead->offset <= behind->offset)) return ahead;
    return behind;
  }

  uint32_t grown(uint32_t current) const {
    const uint64_t by_factor = static_cast<uint64_t>(current) * options.late_growth;
    // At least one more, so a growth factor of 1 (or a lead of 0) still moves the prefetch.
    const uint64_t wanted = std::max<uint64_t>(by_factor, uint64_t{current} + 1);
    const uint64_t capped = std::min<uint64_t>(wanted, options.max_lead);
    return std::max(current, static_cast<uint32_t>(capped));  // never shrink an initial_lead
  }

  // Occurrence of the latest acquire of `access` in this step's recording.
  uint32_t recorded_occurrence(Access access) const {
    const auto seen = std::count(recording.begin(), recording.end(), access);
    return seen > 0 ? static_cast<uint32_t>(seen - 1) : 0;
  }

  // The largest lead any entry can have: due() never needs to look further ahead.
  size_t lead_horizon() const { return std::max<size_t>(options.initial_lead, options.max_lead); }
};

AccessSchedule::AccessSchedule(AccessScheduleOptions options)
    : state_(std::make_unique<State>(options)) {}
AccessSchedule::~AccessSchedule() = default;
AccessSchedule::AccessSchedule(AccessSchedule&&) noexcept = default;
AccessSchedule& AccessSchedule::operator=(AccessSchedule&&) noexcept = default;

void AccessSchedule::step_begin() {
  State& s = *state_;
  if (s.in_step) step_end();
  s.in_step = true;
  s.step_differs = false;
  s.step_discarded = false;
  s.recording.clear();
  // Acquires outside a step (or a step cut short) may have left the cursor mid-trace: the new
  // step starts at the trace's start, in the next cycle.
  if (!s.trace.empty() && s.cursor != 0) {
    s.position += s.trace.size() - s.cursor;
    s.cursor = 0;
    s.last.reset();
  }
}

void AccessSchedule::step_end() {
  State& s = *state_;
  if (!s.in_step) return;
  s.in_step = false;
  ++s.stats.steps;
  // An empty step says nothing about the order: keep the trace rather than drop it.
  if (s.step_discarded || s.recording.empty()) return;
  if (s.trace.empty()) {
    s.install(std::move(s.recording));
    s.stats.given_order = false;
  } else if (s.step_differs || s.recording.size() != s.trace.size()) {
    s.install(std::move(s.recording));
    s.stats.given_order = false;
    ++s.stats.rerecords;
  }
  s.recording.clear();
}

void AccessSchedule::set_order(std::vector<Access> order) {
  State& s = *state_;
  s.install(std::move(order));
  s.position = 0;
  s.stats.given_order = !s.trace.empty();
  if (s.in_step) {
    s.step_discarded = true;
    s.recording.clear();
  }
}

void AccessSchedule::on_acquire(Access access) {
  State& s = *state_;
  ++s.stats.acquires;
  s.recency[access.tensor] = ++s.tick;
  if (s.in_step && !s.step_discarded) s.recording.push_back(access);
  if (s.trace.empty()) {
    ++s.position;
    return;
  }
  const std::optional<Match> match = s.find_nearest(access);
  if (!match) {
    ++s.stats.unknown;
    s.step_differs = true;
    s.last.reset();
    return;
  }
  if (match->ahead && match->offset == 0) {
    ++s.stats.matched;
  } else {
    ++s.stats.realigned;
    s.step_differs = true;
  }
  // Skipped entries count as passed; a jump back still moves forward, by this one acquire.
  s.position += match->ahead ? match->offset + 1 : 1;
  s.trace[match->index].overwrite = access.overwrite;  // the latest acquire's mode
  s.last = match->index;
  s.cursor = (match->index + 1) % s.trace.size();
}

void AccessSchedule::on_late(Access access) {
  State& s = *state_;
  ++s.stats.late;
  std::optional<size_t> entry;
  if (s.last && s.trace[*s.last] == access) {
    entry = s.last;
  } else if (!s.trace.empty() && s.trace[s.cursor] == access) {
    entry = s.cursor;  // reported just before its on_acquire
  }
  if (entry) {
    const uint32_t before = s.lead[*entry];
    s.lead[*entry] = s.grown(before);
    STRATA_LOG(kDebug, "schedule: late arrival of tensor %d (%s) at entry %d: lead %d -> %d",
               access.tensor, to_string(access.tier), *entry, before, s.lead[*entry]);
    s.leads[LeadKey{access_key(access), s.occurrence[*entry]}] = s.lead[*entry];
    return;
  }
  // Not in the trace (none yet, or an unknown access): key it by this step's recording, which
  // may become the trace at step_end.
  if (!s.in_step || s.step_discarded) return;
  const LeadKey key{access_key(access), s.recorded_occurrence(access)};
  const auto it = s.leads.find(key);
  s.leads[key] = s.grown(it != s.leads.end() ? it->second : s.options.initial_lead);
}

std::vector<DueAccess> AccessSchedule::due(size_t max) const {
  const State& s = *state_;
  std::vector<DueAccess> result;
  const size_t n = s.trace.size();
  if (n == 0 || max == 0) return result;
  const size_t horizon = std::min(n, s.lead_horizon());
  for (size_t d = 1; d <= horizon && result.size() < max; ++d) {
    const size_t i = (s.cursor + d - 1) % n;
    if (d <= s.lead[i]) result.push_back(DueAccess{s.trace[i], s.position + d - 1, d});
  }
  return result;
}

std::vector<DueAccess> AccessSchedule::due_in_order(size_t max) const {
  const State& s = *state_;
  std::vector<DueAccess> result;
  const size_t n = s.trace.size();
  if (n == 0 || max == 0) return result;
  const size_t horizon = std::min(n, s.lead_horizon());
  size_t furthest = 0;  // distance of the furthest due entry
  for (size_t d = 1; d <= horizon; ++d) {
    if (d <= s.lead[(s.cursor + d - 1) % n]) furthest = d;
  }
  for (size_t d = 1; d <= furthest && result.size() < max; ++d) {
    result.push_back(DueAccess{s.trace[(s.cursor + d - 1) % n], s.position + d - 1, d});
  }
  return result;
}

std::vector<DueAccess> AccessSchedule::upcoming(size_t max) const {
  const State& s = *state_;
  std::vector<DueAccess> result;
  const size_t n = s.trace.size();
  for (size_t d = 1; d <= n && result.size() < max; ++d) {
    result.push_back(DueAccess{s.trace[(s.cursor + d - 1) % n], s.position + d - 1, d});
  }
  return result;
}

std::optional<uint64_t> AccessSchedule::next_use(TensorId tensor) const {
  const State& s = *state_;
  const auto it = s.uses.find(tensor);
  if (it == s.uses.end()) return std::nullopt;
  const std::vector<size_t>& indices = it->second;
  const auto next = std::lower_bound(indices.begin(), indices.end(), s.cursor);
  const size_t index = next != indices.end() ? *next : indices.front() + s.trace.size();
  return index - s.cursor + 1;
}

TensorId AccessSchedule::choose_victim(std::span<const TensorId> candidates) const {
  const State& s = *state_;
  STRATA_DCHECK(!candidates.empty());
  if (candidates.empty()) return 0;
  TensorId best = candidates.front();
  if (!s.trace.empty()) {
    // Belady: the furthest next use; never used again is furthest of all.
    const auto distance = [&](TensorId t) {
      return next_use(t).value_or(std::numeric_limits<uint64_t>::max());
    };
    uint64_t best_distance = distance(best);
    for (const TensorId t : candidates.subspan(1)) {
      const uint64_t d = distance(t);
      if (d > best_distance || (d == best_distance && t < best)) {
        best = t;
        best_distance = d;
      }
    }
    return best;
  }
  // Least recently acquired; never acquired (tick 0) is the oldest.
  const auto tick = [&](TensorId t) {
    const auto it = s.recency.find(t);
    return it != s.recency.end() ? it->second : uint64_t{0};
  };
  uint64_t best_tick = tick(best);
  for (const TensorId t : candidates.subspan(1)) {
    const uint64_t k = tick(t);
    if (k < best_tick || (k == best_tick && t < best)) {
      best = t;
      best_tick = k;
    }
  }
  return best;
}

void AccessSchedule::forget(TensorId tensor) {
  State& s = *state_;
  s.recency.erase(tensor);
  // The store reuses slot ids: what was learned about this tensor must not apply to the next.
  absl::erase_if(s.leads,
                 [&](const auto& entry) { return key_tensor(entry.first.first) == tensor; });
  std::erase_if(s.recording, [&](const Access& a) { return a.tensor == tensor; });
  if (!s.uses.contains(tensor)) return;

  // Drop its entries; the cursor keeps pointing at the same next access (or the one after the
  // dropped ones). Other accesses keep their occurrence numbers and leads.
  size_t kept = 0;
  size_t cursor = 0;
  for (size_t i = 0; i < s.trace.size(); ++i) {
    if (i == s.cursor) cursor = kept;
    if (s.trace[i].tensor == tensor) continue;
    s.trace[kept] = s.trace[i];
    s.occurrence[kept] = s.occurrence[i];
    s.lead[kept] = s.lead[i];
    ++kept;
  }
  s.trace.resize(kept);
  s.occurrence.resize(kept);
  s.lead.resize(kept);
  s.cursor = kept == 0 ? 0 : cursor % kept;
  s.last.reset();
  s.uses.clear();
  for (size_t i = 0; i < kept; ++i) s.uses[s.trace[i].tensor].push_back(i);
  if (kept == 0) s.stats.given_order = false;
}

bool AccessSchedule::has_trace() const { return !state_->trace.empty(); }

uint64_t AccessSchedule::position() const { return state_->position; }

AccessScheduleStats AccessSchedule::stats() const {
  AccessScheduleStats stats = state_->stats;
  stats.trace_length = state_->trace.size();
  stats.has_trace = !state_->trace.empty();
  return stats;
}

}  // namespace strata
