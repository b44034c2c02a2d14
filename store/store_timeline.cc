// The store's timeline: every move (issue, I/O, completion), every wait and every acquire as
// spans, recorded only while TensorStore::set_timeline has one set (docs/store.md, "Timeline").
#include <absl/strings/str_format.h>

#include "strata/base/mutex.h"
#include "tensor_store_impl.h"

namespace strata {

using Impl = TensorStore::Impl;

void TensorStore::set_timeline(std::shared_ptr<Timeline> timeline) {
  Impl& s = *impl_;
  MutexLock lock(&s.mu);
  s.timeline = timeline;
  if (s.mover != nullptr) s.mover->set_timeline(std::move(timeline));
}

namespace {

double us_between(absl::Time a, absl::Time b) { return absl::ToDoubleMicroseconds(b - a); }

}  // namespace

void Impl::trace_wait(std::string_view what, const Tensor& t, uint64_t ref, absl::Time start) {
  if (timeline == nullptr) return;
  timeline->add(Timeline::Span{Timeline::thread_track(),
                               std::string(what),
                               "wait",
                               timeline->ns_at(start),
                               timeline->now_ns(),
                               0,
                               ref,
                               {Timeline::Arg::str("tensor", t.name)}});
}

void Impl::trace_move(const Tensor& t, TierKind from, TierKind to, uint64_t id, absl::Time start,
                      absl::Time issue_end, absl::Time io_end, const std::string& issuer, bool ok) {
  if (timeline == nullptr || id == 0) return;
  const absl::Time end = absl::Now();
  // What the move was for: a write-back goes home; a fetch issued by a prefetch worker is a
  // prefetch; any other is a fetch some caller needed now.
  const char* purpose = to == t.home                       ? "write-back"
                        : issuer.rfind("prefetch", 0) == 0 ? "prefetch"
                                                           : "fetch";
  std::vector<Timeline::Arg> args = {
      Timeline::Arg::str("tensor", t.name),
      Timeline::Arg::str("from", std::string(to_string(from))),
      Timeline::Arg::str("to", std::string(to_string(to))),
      Timeline::Arg::num("bytes", static_cast<double>(t.bytes)),
      Timeline::Arg::str("purpose", purpose),
      Timeline::Arg::str("issuer", issuer),
      Timeline::Arg::num("issue_us", us_between(start, issue_end)),
      Timeline::Arg::str("ok", ok ? "yes" : "no"),
  };
  if (io_end != absl::InfinitePast()) {
    // I/O done to completion seen: how long the move waited for someone to notice it ended.
    args.push_back(Timeline::Arg::num("io_us", us_between(issue_end, io_end)));
    args.push_back(Timeline::Arg::num("completion_lag_us", us_between(io_end, end)));
    args.push_back(Timeline::Arg::str("completed_by", Timeline::thread_track()));
  }
  const std::string track = absl::StrFormat("%s->%s", to_string(from), to_string(to));
  timeline->add(Timeline::Span{track, t.name, "move", timeline->ns_at(start), timeline->ns_at(end),
                               id, 0, std::move(args)});
  // The issue on the issuer's own row: a long one waited for staging or the drives' queue.
  timeline->add(Timeline::Span{issuer,
                               absl::StrFormat("issue %s %s", t.name, track),
                               "issue",
                               timeline->ns_at(start),
                               timeline->ns_at(issue_end),
                               0,
                               id,
                               {}});
}

void Impl::trace_acquire(const Tensor& t, TierKind tier, AccessMode mode, absl::Time start,
                         bool hit, bool late) {
  if (timeline == nullptr) return;
  timeline->add(Timeline::Span{
      Timeline::thread_track(),
      absl::StrFormat("acquire %s", t.name),
      "acquire",
      timeline->ns_at(start),
      timeline->now_ns(),
      0,
      t.copies[tier_index(tier)].move_id,
      {Timeline::Arg::str("tier", std::string(to_string(tier))),
       Timeline::Arg::str("mode", to_string(mode)), Timeline::Arg::str("hit", hit ? "yes" : "no"),
       Timeline::Arg::str("late", late ? "yes" : "no")}});
}

}  // namespace strata
