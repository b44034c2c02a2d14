#include "strata/store/copy_state.h"

#include <absl/strings/str_format.h>

#include "strata/base/debug.h"
#include "strata/base/log.h"

namespace strata {

std::string_view to_string(CopyState state) {
  switch (state) {
    case CopyState::kAbsent:
      return "absent";
    case CopyState::kStale:
      return "stale";
    case CopyState::kArriving:
      return "arriving";
    case CopyState::kValid:
      return "valid";
    case CopyState::kEvicting:
      return "evicting";
    case CopyState::kEvictingStale:
      return "evicting-stale";
  }
  return "?";
}

std::string_view to_string(CopyEvent event) {
  switch (event) {
    case CopyEvent::kPlace:
      return "place";
    case CopyEvent::kBeginArrival:
      return "begin_arrival";
    case CopyEvent::kArrive:
      return "arrive";
    case CopyEvent::kMissArrival:
      return "miss_arrival";
    case CopyEvent::kDeclareValid:
      return "declare_valid";
    case CopyEvent::kOutdate:
      return "outdate";
    case CopyEvent::kRestore:
      return "restore";
    case CopyEvent::kBeginEviction:
      return "begin_eviction";
    case CopyEvent::kCancelEviction:
      return "cancel_eviction";
    case CopyEvent::kDrop:
      return "drop";
  }
  return "?";
}

std::optional<CopyState> next_state(CopyState state, CopyEvent event) {
  using S = CopyState;
  switch (event) {
    case CopyEvent::kPlace:
      if (state == S::kAbsent) return S::kStale;
      break;
    case CopyEvent::kBeginArrival:
      if (state == S::kStale || state == S::kValid) return S::kArriving;
      break;
    case CopyEvent::kArrive:
      if (state == S::kArriving) return S::kValid;
      break;
    case CopyEvent::kMissArrival:
      if (state == S::kArriving) return S::kStale;
      break;
    case CopyEvent::kDeclareValid:
      if (state == S::kStale) return S::kValid;
      break;
    case CopyEvent::kOutdate:
      if (state == S::kValid) return S::kStale;
      if (state == S::kEvicting) return S::kEvictingStale;
      return state;  // nothing newest to lose; an arriving copy lands stale by its version
    case CopyEvent::kRestore:
      if (state == S::kStale) return S::kValid;
      if (state == S::kEvictingStale) return S::kEvicting;
      break;
    case CopyEvent::kBeginEviction:
      if (state == S::kValid) return S::kEvicting;
      if (state == S::kStale) return S::kEvictingStale;
      break;
    case CopyEvent::kCancelEviction:
      if (state == S::kEvicting) return S::kValid;
      if (state == S::kEvictingStale) return S::kStale;
      break;
    case CopyEvent::kDrop:
      if (state != S::kArriving && state != S::kAbsent) return S::kAbsent;
      break;
  }
  return std::nullopt;
}

absl::Status CopyStateMachine::try_apply(CopyEvent event) {
  const std::optional<CopyState> next = next_state(state_, event);
  if (!next.has_value()) {
    return absl::FailedPreconditionError(absl::StrFormat("copy state: %s is illegal in state %s",
                                                         to_string(event), to_string(state_)));
  }
  // A dropped copy's memory goes back to its tier: nothing may still use it.
  if (event == CopyEvent::kDrop && (pins_ > 0 || moves_out_ > 0 || writers_ > 0)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("copy state: drop while in use (%d pins, %d moves out, %d writers)", pins_,
                        moves_out_, writers_));
  }
  state_ = *next;
  return absl::OkStatus();
}

void CopyStateMachine::report(const absl::Status& status) {
  STRATA_DCHECK_OK(status);
  STRATA_LOG(kError, "tensor store internal error, please report it: %s", status.message());
}

bool CopyStateMachine::apply(CopyEvent event) {
  const absl::Status status = try_apply(event);
  if (!status.ok()) report(status);
  return status.ok();
}

void CopyStateMachine::decrement(uint32_t& count, std::string_view what) {
  if (count > 0) {
    --count;
    return;
  }
  report(absl::FailedPreconditionError(
      absl::StrFormat("copy state: %s ended more often than it began", what)));
}

void CopyStateMachine::begin_arrival() {
  apply(CopyEvent::kBeginArrival);
  written_back_early_ = false;
}

void CopyStateMachine::outdate() {
  apply(CopyEvent::kOutdate);
  prefetched_ = false;
  written_back_early_ = false;
}

bool CopyStateMachine::drop() {
  if (!apply(CopyEvent::kDrop)) return false;
  *this = CopyStateMachine();
  return true;
}

void CopyStateMachine::acquire(bool write) {
  ++pins_;
  if (write) {
    ++writers_;
    written_back_early_ = false;
  }
}

void CopyStateMachine::release(bool write) {
  decrement(pins_, "an acquisition");
  if (write) decrement(writers_, "a write acquisition");
}

void CopyStateMachine::begin_move_out() {
  ++pins_;
  ++moves_out_;
  ++readers_;
}

void CopyStateMachine::move_reads_issued() { decrement(readers_, "a move's reads"); }

void CopyStateMachine::end_move_out(bool still_reading) {
  decrement(pins_, "a move's pin");
  decrement(moves_out_, "a move out");
  if (still_reading) decrement(readers_, "a move's reads");
}

void CopyStateMachine::end_prefetch(bool landed) {
  prefetching_ = false;
  if (landed && pins_ == 0) prefetched_ = true;
}

void CopyStateMachine::end_early_writeback(bool home_current) {
  writing_back_early_ = false;
  if (home_current) written_back_early_ = true;
}

}  // namespace strata
