#include "strata/store/timeline.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <utility>

#include "strata/base/mutex.h"
#include "strata/base/text.h"

namespace strata {

namespace {

thread_local std::string current_track = "host";

}  // namespace

Timeline::Arg Timeline::Arg::num(std::string key, double value) {
  return Arg{std::move(key), absl::StrFormat("%.15g", value), true};
}

Timeline::Arg Timeline::Arg::str(std::string key, std::string value) {
  return Arg{std::move(key), std::move(value), false};
}

uint64_t Timeline::next_id() {
  static std::atomic<uint64_t> ids{0};
  return ids.fetch_add(1, std::memory_order_relaxed) + 1;
}

void Timeline::add(Span span) {
  span.end_ns = std::max(span.end_ns, span.start_ns);
  MutexLock lock(&mu_);
  spans_.push_back(std::move(span));
}

std::vector<Timeline::Span> Timeline::spans() const {
  MutexLock lock(&mu_);
  return spans_;
}

void Timeline::set_thread_track(std::string track) { current_track = std::move(track); }

const std::string& Timeline::thread_track() { return current_track; }

namespace {

// One timeline's events: its tracks' names, then its spans, each overlapping span of a track on
// the first lane free at its start (spans of one thread nest or follow one another, so a
// thread's track keeps one lane).
void chrome_events(const std::vector<Timeline::Span>& all, int pid, std::string_view process,
                   int64_t shift_ns, std::vector<std::string>& out) {
  out.push_back(absl::StrFormat(
      R"({"ph": "M", "name": "process_name", "pid": %d, "tid": 0, "args": {"name": %s}})", pid,
      text::json_quote(process)));
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return all[a].start_ns < all[b].start_ns ||
           (all[a].start_ns == all[b].start_ns && all[a].end_ns > all[b].end_ns);
  });
  std::map<std::string, std::vector<std::vector<std::pair<int64_t, int64_t>>>> lanes;
  std::vector<std::string> row(all.size());
  for (size_t i : order) {
    const Timeline::Span& s = all[i];
    auto& track = lanes[s.track];
    size_t lane = 0;
    for (; lane < track.size(); ++lane) {
      // Free when every span open on it contains this one or ended before it starts.
      auto& open = track[lane];
      std::erase_if(open, [&](const auto& iv) { return iv.second <= s.start_ns; });
      if (open.empty() || open.back().second >= s.end_ns) break;
    }
    if (lane == track.size()) track.emplace_back();
    track[lane].emplace_back(s.start_ns, s.end_ns);
    row[i] = lane == 0 ? s.track : absl::StrFormat("%s #%d", s.track, lane + 1);
  }
  std::map<std::string, int> tids;
  for (size_t i : order) tids.emplace(row[i], 0);
  int next = 1;
  for (auto& [name, tid] : tids) {
    tid = next++;
    out.push_back(absl::StrFormat(
        R"({"ph": "M", "name": "thread_name", "pid": %d, "tid": %d, "args": {"name": %s}})", pid,
        tid, text::json_quote(name)));
  }
  for (size_t i : order) {
    const Timeline::Span& s = all[i];
    std::string e = absl::StrFormat(
        R"({"ph": "X", "pid": %d, "tid": %d, "name": %s, "cat": %s, "ts": %.3f, "dur": %.3f, "args": {)",
        pid, tids[row[i]], text::json_quote(s.name), text::json_quote(s.category),
        static_cast<double>(s.start_ns + shift_ns) * 1e-3,
        static_cast<double>(s.end_ns - s.start_ns) * 1e-3);
    bool first = true;
    auto arg = [&](std::string_view key, const std::string& value) {
      if (!first) e += ", ";
      first = false;
      e += text::json_quote(key) + ": " + value;
    };
    if (s.id != 0) arg("id", absl::StrFormat("%d", s.id));
    if (s.ref != 0) arg("ref", absl::StrFormat("%d", s.ref));
    for (const Timeline::Arg& a : s.args) {
      arg(a.key, a.number ? a.value : text::json_quote(a.value));
    }
    out.push_back(e + "}}");
  }
}

}  // namespace

std::string Timeline::chrome_json(
    const std::vector<std::pair<std::string, const Timeline*>>& processes) {
  std::vector<std::string> events;
  absl::Time origin = absl::InfiniteFuture();
  for (const auto& [name, timeline] : processes) origin = std::min(origin, timeline->origin_);
  int pid = 1;
  for (const auto& [name, timeline] : processes) {
    chrome_events(timeline->spans(), pid++, name,
                  absl::ToInt64Nanoseconds(timeline->origin_ - origin), events);
  }
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t i = 0; i < events.size(); ++i) {
    out += events[i];
    out += i + 1 < events.size() ? ",\n" : "\n";
  }
  return out + "]}\n";
}

}  // namespace strata
