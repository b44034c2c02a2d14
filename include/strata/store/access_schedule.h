// AccessSchedule: the scheduler's decisions, with no I/O and no clock of its own.
//
// The tensor store tells it every acquire and every step boundary; it answers the questions the
// store asks when it prefetches and evicts:
//   - which accesses come next, and which of them are due for a prefetch now;
//   - when each tensor is used next (Belady: evict the copy used furthest in the future);
//   - which candidate to evict when there is no trace (least recently used).
// Thread-compatible: the store calls it under its own lock. A moved-from schedule may only be
// destroyed or assigned to.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "strata/store/tier.h"

namespace strata {

// The store's identifier for a tensor (its slot index). The store calls forget() on destroy.
using TensorId = uint32_t;

struct Access {
  TensorId tensor = 0;
  TierKind tier = TierKind::kGpu;
  // The acquire writes every byte before reading any (AccessMode::kOverwrite): a prefetch has
  // no bytes to bring. Not part of the access's identity: matching, leads and next uses compare
  // tensor and tier only, and a matched acquire updates its trace entry's flag.
  bool overwrite = false;
  friend bool operator==(const Access& a, const Access& b) {
    return a.tensor == b.tensor && a.tier == b.tier;
  }
};

// One upcoming access that is due for a prefetch.
struct DueAccess {
  Access access;
  uint64_t position = 0;  // absolute position (grows across steps)
  uint64_t distance = 0;  // positions from now until it is acquired (1: the next expected one)
};

struct AccessScheduleOptions {
  // A prefetch is due `lead` positions before its access. Each entry starts at initial_lead; a
  // late arrival multiplies that entry's lead by late_growth (by at least one more; at most
  // max_lead), so the same access is fetched earlier next step.
  uint32_t initial_lead = 2;
  uint32_t late_growth = 2;
  uint32_t max_lead = 64;
  // How far a deviating acquire may be from the expected position and still realign to it.
  uint32_t realign_window = 64;
};

struct AccessScheduleStats {
  uint64_t steps = 0;
  uint64_t trace_length = 0;  // accesses in the current trace
  uint64_t acquires = 0;
  uint64_t matched = 0;    // acquires that were the expected next access
  uint64_t realigned = 0;  // deviations resolved by jumping to the nearest match
  uint64_t unknown = 0;    // acquires of an access not in the trace
  uint64_t rerecords = 0;  // steps whose order replaced the trace
  uint64_t late = 0;       // late arrivals reported
  bool has_trace = false;
  bool given_order = false;  // the trace came from set_order()
};

class AccessSchedule {
 public:
  explicit AccessSchedule(AccessScheduleOptions options = {});
  ~AccessSchedule();
  AccessSchedule(AccessSchedule&&) noexcept;
  AccessSchedule& operator=(AccessSchedule&&) noexcept;

  // Step boundaries. The first step (without set_order) records the trace; a later step whose
  // order differed from the trace (any realignment or unknown access, or another length)
  // replaces it at step_end; an empty step keeps it. Acquires outside a step realign but never
  // record. step_begin() ends a step left open, and starts at the trace's first entry (in the
  // next cycle) when acquires outside a step left the position mid-trace; step_end() outside a
  // step does nothing.
  void step_begin();
  void step_end();
  // The order given up front: no warm-up step. Replaces any trace; positions restart at 0. Leads
  // learned from late arrivals are kept. Called mid-step, that step neither records nor
  // re-records. A later step that differs still re-records (the trace is then no longer given).
  void set_order(std::vector<Access> order);

  // Every acquire, in the order the trainer makes them. Advances the position: to the next
  // entry when it matches, else to the nearest matching entry within realign_window (ahead
  // preferred on ties, wrapping across the step boundary), else the position stays and the
  // access counts as unknown. A jump ahead passes the skipped entries' positions too; a jump
  // back still advances by one, so position() never decreases. A matched entry takes the
  // acquire's `overwrite` flag (what due() and upcoming() report for it from then on).
  void on_acquire(Access access);
  // The acquire found its prefetch not yet landed (or not issued): fetch it earlier next step.
  // Report it after on_acquire of the same access (just before it is accepted too). The lead is
  // kept per (tensor, tier, occurrence within the step), so it survives re-recording; an access
  // outside the trace is keyed by this step's recording.
  void on_late(Access access);

  // Accesses after the current position, in order, whose prefetch is due now
  // (distance <= lead), at most `max` of them, looking no further than one full step ahead
  // (wrapping into the next step). Empty without a trace. An entry stays due until it is
  // acquired: the caller skips what is already resident or in flight.
  std::vector<DueAccess> due(size_t max) const;
  // due(), closed under "needed sooner": every access up to the furthest due one, in order, at
  // most `max`. A copy link serves copies in the order they are issued, so a prefetch due early
  // (a large tensor with a long lead) issued ahead of nearer accesses would delay them: they
  // would arrive late behind it however long their own leads grew. Issued in this order, a late
  // arrival's longer lead pulls the accesses before it forward too.
  std::vector<DueAccess> due_in_order(size_t max) const;
  // The next `max` accesses after the current position, in order, due or not, looking no
  // further than one full step ahead: what a read-ahead bounded by bytes walks.
  std::vector<DueAccess> upcoming(size_t max) const;

  // Positions from now until `tensor` is next acquired (in any tier), wrapping into the next
  // step: 1 for the next expected access, at most the trace length. nullopt when the trace never
  // uses it (or there is no trace). O(log uses of the tensor).
  std::optional<uint64_t> next_use(TensorId tensor) const;

  // The candidate to evict: furthest next use (never-used-again first); without a trace, the
  // least recently acquired (never acquired is oldest). Ties: the lower id. `candidates` must
  // not be empty.
  TensorId choose_victim(std::span<const TensorId> candidates) const;

  // The tensor is gone: drop it from the trace, this step's recording, the recency data and its
  // learned leads (the store reuses ids). The position stays on the same next access.
  void forget(TensorId tensor);

  bool has_trace() const;
  // The absolute position of the next expected access (grows across steps; set_order restarts
  // it): DueAccess::position counts on the same scale.
  uint64_t position() const;
  AccessScheduleStats stats() const;

 private:
  // The trace as a cycle with a cursor, per-tensor sorted entry indices (next_use, realignment)
  // and leads keyed by (access, occurrence): see access_schedule.cc.
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace strata
