// The state of one tier's copy of a tensor in the TensorStore: one named state, the counts of
// what uses it, and the marks the prefetcher and the early write-back leave on it, changed only
// through the named transitions below. The data-safety rules of docs/architecture.md rest on it:
//
//   state          memory  bytes                         may be read  may be dropped
//   kAbsent        none    -                             no           -
//   kStale         yes     not the newest                no           yes
//   kArriving      yes     moving in, not complete       no           no (the move owns it)
//   kValid         yes     the newest, complete          yes          only if another copy is
//   kEvicting      yes     the newest, leaving           yes          once its write-back and
//   kEvictingStale yes     not the newest, leaving       no           device work end
//
//   event          from                      to
//   place          kAbsent                   kStale          memory allocated in the tier
//   begin_arrival  kStale, kValid            kArriving       a move into it starts
//   arrive         kArriving                 kValid          the move ended and no write overtook
//   miss_arrival   kArriving                 kStale          the move failed or was overtaken
//   declare_valid  kStale                    kValid          no bytes needed: never written, or
//                                                            overwritten by the caller (kOverwrite)
//   outdate        kValid / kEvicting        kStale / kEvictingStale   a write elsewhere, discard
//                  kAbsent, kStale, kArriving, kEvictingStale: unchanged (an arriving copy's
//                  move carries the old version and lands stale)
//   restore        kStale / kEvictingStale   kValid / kEvicting  a failed overwrite elsewhere
//                                                            gives back what it outdated
//   begin_eviction kValid / kStale           kEvicting / kEvictingStale
//   cancel_eviction kEvicting / kEvictingStale  kValid / kStale  wanted again, or its write-back
//                                                            failed (rule 3)
//   drop           any but kArriving, with no pins, moves out or writers  kAbsent
//
// Every other pair is illegal: next_state() says so, try_apply() refuses it with the reason, and
// the transition methods abort on it in debug builds (a bug in the store, never a user error;
// release builds log it and leave the copy as it was). The table has a test of its own
// (tests/store/copy_state_test.cc).
#pragma once

#include <absl/status/status.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class CopyState : uint8_t {
  kAbsent,
  kStale,
  kArriving,
  kValid,
  kEvicting,
  kEvictingStale,
};

enum class CopyEvent : uint8_t {
  kPlace,
  kBeginArrival,
  kArrive,
  kMissArrival,
  kDeclareValid,
  kOutdate,
  kRestore,
  kBeginEviction,
  kCancelEviction,
  kDrop,
};

inline constexpr CopyState kAllCopyStates[] = {CopyState::kAbsent,   CopyState::kStale,
                                               CopyState::kArriving, CopyState::kValid,
                                               CopyState::kEvicting, CopyState::kEvictingStale};
inline constexpr CopyEvent kAllCopyEvents[] = {
    CopyEvent::kPlace,       CopyEvent::kBeginArrival,  CopyEvent::kArrive,
    CopyEvent::kMissArrival, CopyEvent::kDeclareValid,  CopyEvent::kOutdate,
    CopyEvent::kRestore,     CopyEvent::kBeginEviction, CopyEvent::kCancelEviction,
    CopyEvent::kDrop};

std::string_view to_string(CopyState state);
std::string_view to_string(CopyEvent event);

// The table above: the state `event` leads to from `state`, or nullopt when it is illegal.
std::optional<CopyState> next_state(CopyState state, CopyEvent event);

class CopyStateMachine {
 public:
  CopyState state() const { return state_; }
  bool present() const { return state_ != CopyState::kAbsent; }
  // Holds the tensor's newest bytes, complete: readable, and a source for moves.
  bool valid() const { return state_ == CopyState::kValid || state_ == CopyState::kEvicting; }
  bool arriving() const { return state_ == CopyState::kArriving; }
  bool evicting() const {
    return state_ == CopyState::kEvicting || state_ == CopyState::kEvictingStale;
  }

  uint32_t pins() const { return pins_; }        // acquisitions and moves reading from it
  uint32_t writers() const { return writers_; }  // write acquisitions not yet released
  uint32_t readers() const { return readers_; }  // moves reading it whose reads a write waits for
  uint32_t moves_out() const { return moves_out_; }  // moves reading it, device or host

  bool prefetched() const { return prefetched_; }    // arrived by prefetch, not yet acquired
  bool prefetching() const { return prefetching_; }  // a prefetch is bringing it right now
  bool writing_back_early() const { return writing_back_early_; }  // (one of its pins)
  // Its home copy came from an early write-back, and it has not been written since.
  bool written_back_early() const { return written_back_early_; }
  bool arena_pinned() const { return arena_pinned_; }  // the arena block is pinned for it

  // The state transitions (the table above). Each applies try_apply(event).
  void place() { apply(CopyEvent::kPlace); }
  void begin_arrival();  // also forgets an early write-back's mark: new bytes are coming
  void arrive() { apply(CopyEvent::kArrive); }
  void miss_arrival() { apply(CopyEvent::kMissArrival); }
  void declare_valid() { apply(CopyEvent::kDeclareValid); }
  void outdate();  // also forgets the prefetch and early write-back marks
  void restore() { apply(CopyEvent::kRestore); }
  void begin_eviction() { apply(CopyEvent::kBeginEviction); }
  void cancel_eviction() { apply(CopyEvent::kCancelEviction); }
  // Back to a fresh kAbsent copy, counts and marks cleared; false (and nothing changed) when
  // illegal: the caller must then keep the copy's memory.
  bool drop();

  // The event applied when legal; else the reason it is not, the copy unchanged.
  absl::Status try_apply(CopyEvent event);

  // Counts, each end checked against its start.
  void acquire(bool write);  // a write also forgets the early write-back's mark
  void release(bool write);
  // A move reads this copy (a pin, a move out, a reader until its reads are ordered).
  void begin_move_out();
  void move_reads_issued();               // its device reads are ordered by an event from now on
  void end_move_out(bool still_reading);  // `still_reading`: move_reads_issued() never came

  // Marks.
  void begin_prefetch() { prefetching_ = true; }
  // A prefetch ended; `landed`: it succeeded, and the copy awaits its acquire (none holds it).
  void end_prefetch(bool landed);
  void clear_prefetched() { prefetched_ = false; }
  void begin_early_writeback() { writing_back_early_ = true; }
  // An early write-back ended; `home_current`: the home copy now holds this copy's bytes.
  void end_early_writeback(bool home_current);
  void set_arena_pinned(bool pinned) { arena_pinned_ = pinned; }

 private:
  bool apply(CopyEvent event);  // try_apply, reporting a refusal
  static void report(const absl::Status& status);
  static void decrement(uint32_t& count, std::string_view what);

  CopyState state_ = CopyState::kAbsent;
  uint32_t pins_ = 0;
  uint32_t writers_ = 0;
  uint32_t readers_ = 0;
  uint32_t moves_out_ = 0;
  bool prefetched_ = false;
  bool prefetching_ = false;
  bool writing_back_early_ = false;
  bool written_back_early_ = false;
  bool arena_pinned_ = false;
};

}  // namespace strata
