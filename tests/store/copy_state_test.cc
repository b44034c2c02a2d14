// The tensor store's copy state machine (store/copy_state.h): every legal transition, every
// illegal one refused, the counts checked, and the debug builds' abort on a refused transition.
#include "strata/store/copy_state.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <map>
#include <utility>

#include "strata/base/debug.h"

namespace strata {
namespace {

using S = CopyState;
using E = CopyEvent;

// The table of copy_state.h, written out again here: the implementation must agree with it.
const std::map<std::pair<S, E>, S>& legal_transitions() {
  static const std::map<std::pair<S, E>, S> table{
      {{S::kAbsent, E::kPlace}, S::kStale},
      {{S::kStale, E::kBeginArrival}, S::kArriving},
      {{S::kValid, E::kBeginArrival}, S::kArriving},
      {{S::kArriving, E::kArrive}, S::kValid},
      {{S::kArriving, E::kMissArrival}, S::kStale},
      {{S::kStale, E::kDeclareValid}, S::kValid},
      {{S::kAbsent, E::kOutdate}, S::kAbsent},
      {{S::kStale, E::kOutdate}, S::kStale},
      {{S::kArriving, E::kOutdate}, S::kArriving},
      {{S::kValid, E::kOutdate}, S::kStale},
      {{S::kEvicting, E::kOutdate}, S::kEvictingStale},
      {{S::kEvictingStale, E::kOutdate}, S::kEvictingStale},
      {{S::kStale, E::kRestore}, S::kValid},
      {{S::kEvictingStale, E::kRestore}, S::kEvicting},
      {{S::kValid, E::kBeginEviction}, S::kEvicting},
      {{S::kStale, E::kBeginEviction}, S::kEvictingStale},
      {{S::kEvicting, E::kCancelEviction}, S::kValid},
      {{S::kEvictingStale, E::kCancelEviction}, S::kStale},
      {{S::kStale, E::kDrop}, S::kAbsent},
      {{S::kValid, E::kDrop}, S::kAbsent},
      {{S::kEvicting, E::kDrop}, S::kAbsent},
      {{S::kEvictingStale, E::kDrop}, S::kAbsent},
  };
  return table;
}

// A copy brought into `state` by legal transitions only.
CopyStateMachine copy_in(S state) {
  CopyStateMachine c;
  const auto step = [&](E event) { REQUIRE(c.try_apply(event).ok()); };
  if (state == S::kAbsent) return c;
  step(E::kPlace);
  switch (state) {
    case S::kArriving:
      step(E::kBeginArrival);
      break;
    case S::kValid:
      step(E::kDeclareValid);
      break;
    case S::kEvicting:
      step(E::kDeclareValid);
      step(E::kBeginEviction);
      break;
    case S::kEvictingStale:
      step(E::kBeginEviction);
      break;
    default:
      break;
  }
  REQUIRE(c.state() == state);
  return c;
}

TEST_CASE("Copy state: the transition table, every pair", "[store][copy_state]") {
  int legal = 0;
  for (S state : kAllCopyStates) {
    for (E event : kAllCopyEvents) {
      CAPTURE(to_string(state), to_string(event));
      const auto it = legal_transitions().find({state, event});
      const std::optional<S> next = next_state(state, event);
      CopyStateMachine c = copy_in(state);
      const absl::Status status = c.try_apply(event);
      if (it == legal_transitions().end()) {
        CHECK_FALSE(next.has_value());
        CHECK(absl::IsFailedPrecondition(status));
        CHECK(c.state() == state);  // refused: unchanged
      } else {
        ++legal;
        REQUIRE(next.has_value());
        CHECK(*next == it->second);
        CHECK(status.ok());
        CHECK(c.state() == it->second);
      }
    }
  }
  CHECK(legal == static_cast<int>(legal_transitions().size()));
}

TEST_CASE("Copy state: what each state allows", "[store][copy_state]") {
  CHECK_FALSE(copy_in(S::kAbsent).present());
  CHECK_FALSE(copy_in(S::kStale).valid());
  CHECK(copy_in(S::kArriving).arriving());
  CHECK_FALSE(copy_in(S::kArriving).valid());
  CHECK(copy_in(S::kValid).valid());
  CHECK_FALSE(copy_in(S::kValid).evicting());
  // An evicting copy is still read (its write-back) and still counts as the newest bytes.
  CHECK(copy_in(S::kEvicting).valid());
  CHECK(copy_in(S::kEvicting).evicting());
  CHECK_FALSE(copy_in(S::kEvictingStale).valid());
  CHECK(copy_in(S::kEvictingStale).evicting());
}

TEST_CASE("Copy state: a copy in use is never dropped", "[store][copy_state]") {
  SECTION("acquired") {
    CopyStateMachine c = copy_in(S::kValid);
    c.acquire(/*write=*/false);
    CHECK(absl::IsFailedPrecondition(c.try_apply(E::kDrop)));
    CHECK(c.state() == S::kValid);
    c.release(/*write=*/false);
    CHECK(c.drop());
    CHECK(c.state() == S::kAbsent);
  }
  SECTION("a move reads it") {
    CopyStateMachine c = copy_in(S::kEvicting);
    c.begin_move_out();
    CHECK(c.readers() == 1);
    c.move_reads_issued();
    CHECK(c.readers() == 0);
    CHECK(absl::IsFailedPrecondition(c.try_apply(E::kDrop)));
    c.end_move_out(/*still_reading=*/false);
    CHECK(c.pins() == 0);
    CHECK(c.moves_out() == 0);
    CHECK(c.drop());
  }
  SECTION("being written") {
    CopyStateMachine c = copy_in(S::kValid);
    c.acquire(/*write=*/true);
    CHECK(c.writers() == 1);
    CHECK(absl::IsFailedPrecondition(c.try_apply(E::kDrop)));
    c.release(/*write=*/true);
    CHECK(c.writers() == 0);
    CHECK(c.try_apply(E::kDrop).ok());
  }
}

TEST_CASE("Copy state: the marks follow the bytes", "[store][copy_state]") {
  SECTION("a write elsewhere forgets the prefetch and the early write-back") {
    CopyStateMachine c = copy_in(S::kValid);
    c.begin_prefetch();
    c.end_prefetch(/*landed=*/true);
    c.begin_early_writeback();
    c.end_early_writeback(/*home_current=*/true);
    CHECK(c.prefetched());
    CHECK(c.written_back_early());
    CHECK_FALSE(c.writing_back_early());
    c.outdate();
    CHECK_FALSE(c.prefetched());
    CHECK_FALSE(c.written_back_early());
  }
  SECTION("a write to the copy itself forgets its early write-back, a read does not") {
    CopyStateMachine c = copy_in(S::kValid);
    c.end_early_writeback(/*home_current=*/true);
    c.acquire(/*write=*/false);
    CHECK(c.written_back_early());
    c.acquire(/*write=*/true);
    CHECK_FALSE(c.written_back_early());
  }
  SECTION("new bytes arriving forget the early write-back") {
    CopyStateMachine c = copy_in(S::kValid);
    c.end_early_writeback(/*home_current=*/true);
    c.begin_arrival();
    CHECK_FALSE(c.written_back_early());
  }
  SECTION("a prefetch an acquire already holds is not awaiting its use") {
    CopyStateMachine c = copy_in(S::kValid);
    c.acquire(/*write=*/false);
    c.begin_prefetch();
    CHECK(c.prefetching());
    c.end_prefetch(/*landed=*/true);
    CHECK_FALSE(c.prefetching());
    CHECK_FALSE(c.prefetched());
  }
  SECTION("a dropped copy starts afresh") {
    CopyStateMachine c = copy_in(S::kValid);
    c.set_arena_pinned(true);
    c.end_prefetch(/*landed=*/true);
    REQUIRE(c.drop());
    CHECK_FALSE(c.prefetched());
    CHECK_FALSE(c.arena_pinned());
    CHECK(c.state() == S::kAbsent);
  }
}

// Runs `body` in a child process; its wait status.
template <typename Body>
int in_child(Body body) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

TEST_CASE("Copy state: an illegal transition aborts debug builds, release builds keep the copy",
          "[store][copy_state]") {
  // Each body exits 3 when a release build changed the copy after all.
  const auto illegal_arrival = [] {
    CopyStateMachine c = copy_in(S::kStale);
    c.arrive();  // nothing was moving into it
    if (c.state() != S::kStale) _exit(3);
  };
  const auto drop_while_acquired = [] {
    CopyStateMachine c = copy_in(S::kValid);
    c.acquire(/*write=*/false);
    if (c.drop() || c.state() != S::kValid) _exit(3);
  };
  const auto release_without_acquire = [] {
    CopyStateMachine c = copy_in(S::kValid);
    c.release(/*write=*/true);
    if (c.pins() != 0 || c.writers() != 0) _exit(3);
  };
  for (int status : {in_child(illegal_arrival), in_child(drop_while_acquired),
                     in_child(release_without_acquire)}) {
    if (STRATA_DEBUG_CHECKS) {
      CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT));
    } else {  // reported in the log, the copy unchanged, the process alive
      CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    }
  }
}

}  // namespace
}  // namespace strata
