// Timeline: spans of what happened when (compute, each move between tiers, each wait), recorded
// only when someone asks (TensorStore::set_timeline), written as a Chrome trace ("traceEvents",
// opened by chrome://tracing and Perfetto). Recording takes one lock per span; with no timeline
// set the store pays one pointer test per move and wait.
//
// A span sits on a track (a row: the thread that waited, "compute", or a move's direction such as
// "nvme->gpu"). Spans of one track that overlap (several reads in flight at once) go on lanes
// "nvme->gpu #2", ... when written, so that every row of the trace is a proper nesting.
#pragma once

#include <absl/synchronization/mutex.h>
#include <absl/time/time.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata {

class Timeline {
 public:
  struct Arg {
    std::string key;
    std::string value;
    bool number = false;  // written bare rather than as a JSON string
    static Arg num(std::string key, double value);
    static Arg str(std::string key, std::string value);
  };
  struct Span {
    std::string track;     // the row: a thread's role, "compute", a move's direction
    std::string name;      // a tensor's name, a layer, what was waited for
    std::string category;  // "move", "wait", "compute", "layer", "acquire", ...
    int64_t start_ns = 0;  // since the timeline's origin
    int64_t end_ns = 0;    // >= start_ns
    uint64_t id = 0;       // a move's id (next_id()), 0 for other spans
    uint64_t ref = 0;      // for a wait: the id of the move it waited for, 0 if none
    std::vector<Arg> args;
  };

  Timeline() : origin_(absl::Now()) {}
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Nanoseconds since the origin (the timeline's creation).
  int64_t now_ns() const { return absl::ToInt64Nanoseconds(absl::Now() - origin_); }
  int64_t ns_at(absl::Time t) const { return absl::ToInt64Nanoseconds(t - origin_); }
  // Ids for moves, from 1, unique across every timeline of the process: a wait recorded in one
  // never names another's move by mistake.
  static uint64_t next_id();
  void add(Span span);
  std::vector<Span> spans() const;  // in the order added

  // The Chrome trace: {"traceEvents": [...], "displayTimeUnit": "ms"}, one "X" event per span
  // (ts and dur in microseconds from the first timeline's origin; `id` and `ref` in args when
  // set), each timeline a named process, its tracks named threads, overlapping spans of a track
  // on lanes.
  static std::string chrome_json(
      const std::vector<std::pair<std::string, const Timeline*>>& processes);
  std::string chrome_json() const { return chrome_json({{"strata", this}}); }
  absl::Time origin() const { return origin_; }

  // The track of spans the calling thread records where the store does not name one ("host"
  // unless set): the store's prefetch workers and completion worker name theirs.
  static void set_thread_track(std::string track);
  static const std::string& thread_track();

 private:
  const absl::Time origin_;
  mutable absl::Mutex mu_;
  std::vector<Span> spans_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata
