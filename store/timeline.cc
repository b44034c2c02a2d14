#include "strata/store/timeline.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "strata/base/mutex.h"

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

using Json = nlohmann::ordered_json;

// An argument's value: a number as a number (an integer as one: byte counts stay 4096, not
// 4096.0), anything else as a string.
Json arg_value(const Timeline::Arg& a) {
  if (!a.number) return a.value;
  const double v = std::strtod(a.value.c_str(), nullptr);
  if (std::isfinite(v) && v == std::trunc(v) && std::abs(v) < 1e15) {
    return static_cast<int64_t>(v);
  }
  return v;  // not finite: null, which JSON has in place of NaN and infinities
}

// Microseconds, as the trace wants, from nanoseconds: 1234.567, never 1234.5670000000002 (the
// quotient of two integers is the double nearest the decimal).
double microseconds(int64_t ns) { return static_cast<double>(ns) / 1e3; }

// One timeline's events: its tracks' names, then its spans, each overlapping span of a track on
// the first lane free at its start (spans of one thread nest or follow one another, so a
// thread's track keeps one lane).
void chrome_events(const std::vector<Timeline::Span>& all, int pid, std::string_view process,
                   int64_t shift_ns, Json& out) {
  auto name_event = [&](const char* what, int tid, std::string_view name) {
    out.push_back(
        Json{{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
  };
  name_event("process_name", 0, process);
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
    name_event("thread_name", tid, name);
  }
  for (size_t i : order) {
    const Timeline::Span& s = all[i];
    Json args = Json::object();
    if (s.id != 0) args["id"] = s.id;
    if (s.ref != 0) args["ref"] = s.ref;
    for (const Timeline::Arg& a : s.args) args[a.key] = arg_value(a);
    out.push_back(Json{{"ph", "X"},
                       {"pid", pid},
                       {"tid", tids[row[i]]},
                       {"name", s.name},
                       {"cat", s.category},
                       {"ts", microseconds(s.start_ns + shift_ns)},
                       {"dur", microseconds(s.end_ns - s.start_ns)},
                       {"args", std::move(args)}});
  }
}

}  // namespace

std::string Timeline::chrome_json(
    const std::vector<std::pair<std::string, const Timeline*>>& processes) {
  Json events = Json::array();
  absl::Time origin = absl::InfiniteFuture();
  for (const auto& [name, timeline] : processes) origin = std::min(origin, timeline->origin_);
  int pid = 1;
  for (const auto& [name, timeline] : processes) {
    chrome_events(timeline->spans(), pid++, name,
                  absl::ToInt64Nanoseconds(timeline->origin_ - origin), events);
  }
  const Json trace{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
  // A name that is not UTF-8 is written with U+FFFD in place of its bad bytes, not thrown on.
  return trace.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace strata
