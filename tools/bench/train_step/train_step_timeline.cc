#include "bench/train_step/train_step_timeline.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include "json.h"
#include "strata/base/format_bytes.h"

namespace strata::bench {
namespace {

double arg_number(const Timeline::Span& s, std::string_view key, double fallback = -1) {
  for (const Timeline::Arg& a : s.args) {
    double v = 0;
    if (a.key == key && a.number && absl::SimpleAtod(a.value, &v)) return v;
  }
  return fallback;
}

std::string arg_text(const Timeline::Span& s, std::string_view key) {
  for (const Timeline::Arg& a : s.args) {
    if (a.key == key) return a.value;
  }
  return "";
}

std::string move_kind(const Timeline::Span& m) { return m.track + " " + arg_text(m, "purpose"); }

int64_t overlap(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
  return std::max<int64_t>(0, std::min(a1, b1) - std::max(a0, b0));
}

// What phase of move `m` the instant `x` falls in.
std::string move_phase(const Timeline::Span& m, int64_t x) {
  const double issue = arg_number(m, "issue_us", 0) * 1e3;
  const double io = arg_number(m, "io_us");
  if (x < m.start_ns) return "not yet issued";
  if (static_cast<double>(x) < static_cast<double>(m.start_ns) + issue) return "issue";
  if (io < 0) return "device copy";
  if (static_cast<double>(x) < static_cast<double>(m.start_ns) + issue + io * 1e3) return "I/O";
  return "completion lag";
}

// The union of intervals, sorted and disjoint.
std::vector<std::pair<int64_t, int64_t>> merged(std::vector<std::pair<int64_t, int64_t>> all) {
  std::sort(all.begin(), all.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& iv : all) {
    if (!out.empty() && iv.first <= out.back().second) {
      out.back().second = std::max(out.back().second, iv.second);
    } else {
      out.push_back(iv);
    }
  }
  return out;
}

int64_t covered(const std::vector<std::pair<int64_t, int64_t>>& disjoint) {
  int64_t ns = 0;
  for (const auto& iv : disjoint) ns += iv.second - iv.first;
  return ns;
}

}  // namespace

StepTimelineSummary summarize_step(const std::vector<Timeline::Span>& spans, int64_t start_ns,
                                   int64_t end_ns, const std::string& host_track) {
  StepTimelineSummary s;
  s.step_ms = static_cast<double>(end_ns - start_ns) * 1e-6;
  absl::flat_hash_map<uint64_t, const Timeline::Span*> moves;
  std::vector<std::pair<int64_t, int64_t>> compute, nvme, h2d;
  std::vector<const Timeline::Span*> host;
  for (const Timeline::Span& span : spans) {
    if (span.category == "move" && span.id != 0) moves[span.id] = &span;
    if (span.end_ns <= start_ns || span.start_ns >= end_ns) continue;
    if (span.category == "io") {
      nvme.emplace_back(std::max(span.start_ns, start_ns), std::min(span.end_ns, end_ns));
      if (span.end_ns <= end_ns) {
        const auto bytes = static_cast<uint64_t>(arg_number(span, "bytes", 0));
        (span.track == "nvme read" ? s.nvme_read_bytes : s.nvme_write_bytes) += bytes;
      }
    }
    if (span.category == "copy" && span.track == "h2d link") {
      h2d.emplace_back(std::max(span.start_ns, start_ns), std::min(span.end_ns, end_ns));
    }
    if (span.category == "compute") {
      compute.emplace_back(std::max(span.start_ns, start_ns), std::min(span.end_ns, end_ns));
    }
    if (span.track == host_track && span.category != "layer" && span.category != "step") {
      host.push_back(&span);
      if (span.category == "wait") ++s.waits;
    }
    if (span.category == "wait" && span.name == "staging") {
      s.staging_wait_ms +=
          static_cast<double>(overlap(span.start_ns, span.end_ns, start_ns, end_ns)) * 1e-6;
    }
  }
  // The compute stream's busy time, and the drives': the unions of their spans.
  const std::vector<std::pair<int64_t, int64_t>> busy = merged(std::move(compute));
  s.compute_ms = static_cast<double>(covered(busy)) * 1e-6;
  s.nvme_busy_ms = static_cast<double>(covered(merged(std::move(nvme)))) * 1e-6;
  const std::vector<std::pair<int64_t, int64_t>> link = merged(std::move(h2d));
  s.h2d_busy_ms = static_cast<double>(covered(link)) * 1e-6;
  auto link_busy = [&](int64_t x) {
    auto it = std::upper_bound(link.begin(), link.end(), std::make_pair(x, INT64_MAX));
    return it != link.begin() && std::prev(it)->second > x;
  };
  s.idle_ms = s.step_ms - s.compute_ms;
  // The idle time, sampled every 10 us: what the host thread was in at each instant, the
  // innermost span (a wait inside an issue inside an acquire).
  constexpr int64_t kGrain = 10'000;
  std::map<std::string, int64_t> causes;
  auto cause_at = [&](int64_t x) -> std::string {
    const Timeline::Span* inner = nullptr;
    for (const Timeline::Span* h : host) {
      if (h->start_ns > x || h->end_ns <= x) continue;
      if (inner == nullptr || h->end_ns - h->start_ns < inner->end_ns - inner->start_ns) inner = h;
    }
    if (inner == nullptr) return "host: between acquires (release, launch, step bookkeeping)";
    if (inner->category == "acquire")
      return "host: in acquire, not waiting (bookkeeping, planning)";
    if (inner->category == "issue") return "host: issuing a move";
    if (inner->category != "wait") return "host: " + inner->category;
    if (inner->name == "compute stream") {  // the stream waits for copies, or for nothing
      return link_busy(x) ? "wait: compute stream (its copies on the busy H2D link)"
                          : "wait: compute stream (H2D link idle)";
    }
    if (inner->ref == 0) return "wait: " + inner->name;
    auto m = moves.find(inner->ref);
    if (m == moves.end()) return "wait: " + inner->name + " (move not recorded)";
    return absl::StrFormat("wait: %s: %s, %s", inner->name, move_kind(*m->second),
                           move_phase(*m->second, x));
  };
  int64_t cursor = start_ns;
  auto idle_until = [&](int64_t until) {
    for (int64_t x = cursor + kGrain / 2; x < until; x += kGrain) causes[cause_at(x)] += kGrain;
  };
  for (const auto& iv : busy) {
    idle_until(iv.first);
    cursor = iv.second;
  }
  idle_until(end_ns);
  for (const auto& [cause, ns] : causes) {
    s.idle_ms_by_cause.emplace_back(cause, static_cast<double>(ns) * 1e-6);
  }
  std::sort(s.idle_ms_by_cause.begin(), s.idle_ms_by_cause.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  // The moves that ended within the step.
  std::map<std::string, StepTimelineSummary::Moves> kinds;
  for (const auto& [id, m] : moves) {
    if (m->end_ns < start_ns || m->end_ns > end_ns) continue;
    StepTimelineSummary::Moves& k = kinds[move_kind(*m)];
    k.kind = move_kind(*m);
    ++k.count;
    const double life = static_cast<double>(m->end_ns - m->start_ns);
    k.mean_ms += life * 1e-6;
    k.issue_ms += arg_number(*m, "issue_us", 0) * 1e-3;
    k.io_ms += std::max(0.0, arg_number(*m, "io_us", 0)) * 1e-3;
    k.lag_ms += std::max(0.0, arg_number(*m, "completion_lag_us", 0)) * 1e-3;
    if (life <= 0) continue;
    for (const auto& [other_id, o] : moves) {
      if (other_id == id) continue;
      const double shared =
          static_cast<double>(overlap(m->start_ns, m->end_ns, o->start_ns, o->end_ns)) / life;
      if (absl::StartsWith(o->track, "nvme->")) k.reads_beside += shared;
      if (absl::EndsWith(o->track, "->nvme")) k.writes_beside += shared;
    }
  }
  for (auto& [name, k] : kinds) {
    const auto n = static_cast<double>(k.count);
    k.mean_ms /= n;
    k.issue_ms /= n;
    k.io_ms /= n;
    k.lag_ms /= n;
    k.reads_beside /= n;
    k.writes_beside /= n;
    s.moves.push_back(k);
  }
  return s;
}

std::string step_timeline_text(const std::string& policy, const StepTimelineSummary& s) {
  std::string out = absl::StrFormat(
      "%s timeline of the median step: %.1f ms, compute %.1f ms, compute stream idle %.1f ms "
      "(%d host waits; staging waits %.1f ms on any thread), idle by what the host was doing:\n",
      policy, s.step_ms, s.compute_ms, s.idle_ms, s.waits, s.staging_wait_ms);
  for (const auto& [cause, ms] : s.idle_ms_by_cause) {
    if (ms < 0.05) continue;
    out += absl::StrFormat("    %7.1f ms  %s\n", ms, cause);
  }
  out += absl::StrFormat("  H2D link busy %.1f ms of the step (%.0f%%)\n", s.h2d_busy_ms,
                         100 * s.h2d_busy_ms / s.step_ms);
  if (s.nvme_busy_ms > 0) {
    out += absl::StrFormat(
        "  NVMe busy %.1f ms of the step (%.0f%%): read %s, wrote %s, %.2f GB/s while busy\n",
        s.nvme_busy_ms, 100 * s.nvme_busy_ms / s.step_ms, format_bytes(s.nvme_read_bytes),
        format_bytes(s.nvme_write_bytes),
        static_cast<double>(s.nvme_read_bytes + s.nvme_write_bytes) / (s.nvme_busy_ms * 1e6));
  }
  out += "  moves (count, mean ms: issue + I/O + completion lag; moves beside it on average):\n";
  for (const StepTimelineSummary::Moves& k : s.moves) {
    out += absl::StrFormat(
        "    %-22s %4d  %6.2f ms = %5.2f + %5.2f + %5.2f; beside: %.1f reads, %.1f writes\n",
        k.kind, k.count, k.mean_ms, k.issue_ms, k.io_ms, k.lag_ms, k.reads_beside, k.writes_beside);
  }
  return out;
}

Json step_timeline_json(const StepTimelineSummary& s) {
  Json causes = Json::array();
  for (const auto& [cause, ms] : s.idle_ms_by_cause) {
    causes.push_back(Json{{"cause", cause}, {"ms", json_fixed(ms, 3)}});
  }
  Json moves = Json::array();
  for (const StepTimelineSummary::Moves& k : s.moves) {
    moves.push_back(Json{{"kind", k.kind},
                         {"count", k.count},
                         {"mean_ms", json_fixed(k.mean_ms, 3)},
                         {"issue_ms", json_fixed(k.issue_ms, 3)},
                         {"io_ms", json_fixed(k.io_ms, 3)},
                         {"completion_lag_ms", json_fixed(k.lag_ms, 3)},
                         {"reads_beside", json_fixed(k.reads_beside, 2)},
                         {"writes_beside", json_fixed(k.writes_beside, 2)}});
  }
  return Json{{"step_ms", json_fixed(s.step_ms, 3)},
              {"compute_ms", json_fixed(s.compute_ms, 3)},
              {"idle_ms", json_fixed(s.idle_ms, 3)},
              {"waits", s.waits},
              {"staging_wait_ms", json_fixed(s.staging_wait_ms, 3)},
              {"nvme_busy_ms", json_fixed(s.nvme_busy_ms, 3)},
              {"nvme_read_bytes", s.nvme_read_bytes},
              {"nvme_write_bytes", s.nvme_write_bytes},
              {"h2d_busy_ms", json_fixed(s.h2d_busy_ms, 3)},
              {"idle_by_cause", std::move(causes)},
              {"moves", std::move(moves)}};
}

absl::Status write_timeline_file(const std::string& path, const std::string& text) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "w"), &std::fclose);
  if (file == nullptr || std::fwrite(text.data(), 1, text.size(), file.get()) != text.size() ||
      std::fflush(file.get()) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("train-step: cannot write --timeline=%s: %s (give a writable file)", path,
                        std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace strata::bench
