// arena-replay: replays an allocation trace against a strata::Arena and reports whether it fits.
//
// Trace format, one event per line ('#' starts a comment, blank lines are fine):
//   a <id> <bytes>    allocate; <bytes> is an integer or a size such as 64MiB
//   f <id>            free
// Ids are any token without spaces; an id may be reused after it was freed.
#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "json.h"
#include "strata/allocator/arena.h"
#include "strata/base/size.h"

namespace strata {
namespace {

struct Event {
  bool alloc;
  uint32_t id;     // dense id: index into per-id state
  uint64_t bytes;  // alloc only
};

struct Trace {
  std::vector<Event> events;
  uint32_t ids = 0;
  uint64_t allocations = 0;
  uint64_t peak_live_bytes = 0;  // of the trace itself, whatever the arena does
};

absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

absl::StatusOr<std::string> read_all(const std::string& path) {
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot open trace '", path, "': ", std::strerror(errno)));
  }
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  if (f != stdin) std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("error reading trace '", path, "'"));
  return data;
}

// Splits off the next whitespace-delimited token of `line`.
std::string_view next_token(std::string_view& line) {
  size_t start = line.find_first_not_of(" \t\r");
  if (start == std::string_view::npos) {
    line = {};
    return {};
  }
  line.remove_prefix(start);
  size_t end = line.find_first_of(" \t\r");
  std::string_view token = line.substr(0, end);
  line.remove_prefix(end == std::string_view::npos ? line.size() : end);
  return token;
}

// Parses the trace and checks it is self-consistent: no free of an id that is not live and no
// allocation of an id that is still live. `data` must outlive nothing: ids are made dense here.
absl::StatusOr<Trace> parse_trace(std::string_view data, const std::string& name) {
  Trace trace;
  absl::flat_hash_map<absl::string_view, uint32_t> dense;
  std::vector<uint64_t> live_bytes;  // per dense id; 0 when not live
  uint64_t live = 0;
  size_t line_no = 0;
  auto error = [&](std::string_view what, std::string_view line) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ":", line_no, ": ", av(what), " in '", av(line), "'"));
  };
  while (!data.empty()) {
    ++line_no;
    size_t eol = data.find('\n');
    std::string_view line = data.substr(0, eol);
    data.remove_prefix(eol == std::string_view::npos ? data.size() : eol + 1);
    std::string_view full = line;
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::string_view op = next_token(line);
    if (op.empty()) continue;
    std::string_view id = next_token(line);
    if (op != "a" && op != "f") {
      return error("expected 'a <id> <bytes>' or 'f <id>'", full);
    }
    if (id.empty()) return error("missing id", full);
    auto [it, inserted] = dense.try_emplace(av(id), trace.ids);
    if (inserted) {
      ++trace.ids;
      live_bytes.push_back(0);
    }
    const uint32_t index = it->second;
    if (op == "a") {
      std::string_view size_text = next_token(line);
      if (size_text.empty()) return error("missing byte count", full);
      uint64_t bytes = 0;
      auto [end, ec] =
          std::from_chars(size_text.data(), size_text.data() + size_text.size(), bytes);
      if (ec != std::errc() || end != size_text.data() + size_text.size()) {
        absl::StatusOr<uint64_t> parsed = parse_size(size_text);
        if (!parsed.ok()) return error(std::string(parsed.status().message()), full);
        bytes = *parsed;
      }
      if (bytes == 0) return error("allocation of 0 bytes", full);
      if (live_bytes[index] != 0) {
        return error(absl::StrCat("id '", av(id), "' is allocated again while still live"), full);
      }
      live_bytes[index] = bytes;
      live += bytes;
      trace.peak_live_bytes = std::max(trace.peak_live_bytes, live);
      ++trace.allocations;
      trace.events.push_back(Event{true, index, bytes});
    } else {
      if (live_bytes[index] == 0) {
        return error(absl::StrCat("free of id '", av(id), "' which is not live"), full);
      }
      live -= live_bytes[index];
      live_bytes[index] = 0;
      trace.events.push_back(Event{false, index, 0});
    }
    if (!next_token(line).empty()) return error("unexpected text after the event", full);
  }
  return trace;
}

struct Percentiles {
  uint64_t p50 = 0, p99 = 0, max = 0;
};

Percentiles percentiles(std::vector<uint32_t>& ns) {
  if (ns.empty()) return {};
  auto at = [&](double q) {
    auto nth = ns.begin() + static_cast<ptrdiff_t>(q * static_cast<double>(ns.size() - 1));
    std::nth_element(ns.begin(), nth, ns.end());
    return uint64_t{*nth};
  };
  return Percentiles{at(0.5), at(0.99), *std::max_element(ns.begin(), ns.end())};
}

struct Replay {
  uint64_t failed = 0;
  uint64_t compactions = 0;
  uint64_t bytes_moved = 0;
  uint64_t peak_used = 0;  // arena bytes, after rounding to the alignment
  double worst_fragmentation = 0;
  Percentiles alloc_ns, free_ns;
};

uint32_t elapsed_ns(std::chrono::steady_clock::time_point start) {
  auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  return static_cast<uint32_t>(std::min<int64_t>(ns, UINT32_MAX));
}

absl::StatusOr<Replay> replay(const Trace& trace, uint64_t capacity, uint64_t alignment,
                              bool compaction) {
  absl::StatusOr<Arena> created = Arena::create(capacity, alignment);
  if (!created.ok()) return created.status();
  Arena& arena = *created;
  std::vector<BlockHandle> handles(trace.ids);  // invalid handle: not live or failed
  std::vector<uint32_t> alloc_ns, free_ns;
  alloc_ns.reserve(trace.allocations);
  free_ns.reserve(trace.events.size() - trace.allocations);
  // The arena holds no bytes here, so executing a plan is only counting it.
  auto no_copy = [](const CompactionPlan&) { return absl::OkStatus(); };
  Replay r;
  for (const Event& e : trace.events) {
    if (e.alloc) {
      auto start = std::chrono::steady_clock::now();
      absl::StatusOr<BlockHandle> h =
          compaction ? arena.allocate_compacting(e.bytes, 0, no_copy) : arena.allocate(e.bytes);
      alloc_ns.push_back(elapsed_ns(start));
      if (h.ok()) {
        handles[e.id] = *h;
      } else if (!absl::IsResourceExhausted(h.status())) {
        return h.status();
      }
    } else if (handles[e.id].valid()) {
      auto start = std::chrono::steady_clock::now();
      absl::Status st = arena.free(handles[e.id]);
      free_ns.push_back(elapsed_ns(start));
      if (!st.ok()) return st;
      handles[e.id] = BlockHandle{};
    }
    r.worst_fragmentation = std::max(r.worst_fragmentation, arena.stats().fragmentation);
  }
  const ArenaStats s = arena.stats();
  r.failed = s.failures;
  r.compactions = s.compactions;
  r.bytes_moved = s.bytes_moved;
  r.peak_used = s.peak_used;
  r.alloc_ns = percentiles(alloc_ns);
  r.free_ns = percentiles(free_ns);
  return r;
}

void print_json(const Trace& trace, uint64_t capacity, uint64_t alignment, bool compaction,
                const Replay& r, uint64_t failed_without) {
  const Json doc{{"events", trace.events.size()},
                 {"allocations", trace.allocations},
                 {"capacity", capacity},
                 {"alignment", alignment},
                 {"compaction", compaction},
                 {"peak_live_bytes", trace.peak_live_bytes},
                 {"peak_used_bytes", r.peak_used},
                 {"failed", r.failed},
                 {"failed_without_compaction", failed_without},
                 {"compactions", r.compactions},
                 {"bytes_moved", r.bytes_moved},
                 {"worst_fragmentation", json_fixed(r.worst_fragmentation, 6)},
                 {"alloc_ns_p50", r.alloc_ns.p50},
                 {"alloc_ns_p99", r.alloc_ns.p99},
                 {"alloc_ns_max", r.alloc_ns.max},
                 {"free_ns_p50", r.free_ns.p50},
                 {"free_ns_p99", r.free_ns.p99},
                 {"free_ns_max", r.free_ns.max}};
  std::cout << json_line(doc) << "\n";
}

void print_table(const std::string& name, const Trace& trace, uint64_t capacity, uint64_t alignment,
                 bool compaction, const Replay& r, uint64_t failed_without) {
  auto row = [](std::string_view label, const std::string& value) {
    std::cout << absl::StrFormat("  %-26s %s\n", av(label), value);
  };
  std::cout << "arena-replay: " << name << "\n";
  row("events", absl::StrFormat("%d (%d allocations, %d frees)", trace.events.size(),
                                trace.allocations, trace.events.size() - trace.allocations));
  row("capacity", absl::StrFormat("%s (alignment %d)", format_bytes(capacity), alignment));
  row("peak live bytes (trace)",
      absl::StrFormat("%s (%d bytes)", format_bytes(trace.peak_live_bytes), trace.peak_live_bytes));
  row("peak used (arena)", format_bytes(r.peak_used));
  row("compaction", compaction ? "on" : "off");
  row("failed allocations",
      absl::StrFormat("%d (without compaction: %d)", r.failed, failed_without));
  row("compactions", absl::StrFormat("%d (%s moved)", r.compactions, format_bytes(r.bytes_moved)));
  row("worst fragmentation", absl::StrFormat("%.3f", r.worst_fragmentation));
  row("allocate latency", absl::StrFormat("p50 %d ns, p99 %d ns, max %d ns", r.alloc_ns.p50,
                                          r.alloc_ns.p99, r.alloc_ns.max));
  row("free latency", absl::StrFormat("p50 %d ns, p99 %d ns, max %d ns", r.free_ns.p50,
                                      r.free_ns.p99, r.free_ns.max));
  std::string verdict;
  if (r.failed == 0) {
    verdict = "fits";
  } else if (trace.peak_live_bytes > capacity) {
    verdict = absl::StrFormat("does not fit: the trace needs %s live at its peak",
                              format_bytes(trace.peak_live_bytes));
  } else {
    verdict = "does not fit: fragmentation (try --compaction=on or a larger arena)";
  }
  row("verdict", verdict);
}

int run(int argc, char** argv) {
  cli::FlagSet flags("arena-replay",
                     "Replays an allocation trace against a strata arena and reports whether it "
                     "fits: failed allocations\nwith and without compaction, bytes moved, "
                     "fragmentation and allocator latency.\nTRACE is a file ('-' for stdin) "
                     "with one event per line: 'a <id> <bytes>' or 'f <id>'; '#' starts\na "
                     "comment. tools/torch_snapshot_to_trace.py converts a PyTorch memory "
                     "snapshot.",
                     "TRACE");
  uint64_t capacity = 0;
  uint64_t alignment = 256;
  std::string compaction = "on";
  bool json = false;
  flags
      .add_size("capacity", &capacity,
                "arena size, e.g. 40GiB (rounded down to a multiple of --align)")
      .required();
  flags.add_uint64("align", &alignment,
                   "arena granularity in bytes (power of two): 256 for GPU memory, 4096 for "
                   "pinned host memory or NVMe");
  flags.add_enum("compaction", &compaction, {"on", "off"},
                 "compact the arena when an allocation fails for fragmentation");
  flags.add_bool("json", &json, "print one JSON object instead of a table");
  std::vector<std::string> args;
  if (std::optional<int> exit_code = flags.parse_or_exit(argc, argv, &args)) return *exit_code;
  if (args.size() != 1) {
    return flags.usage_error(args.empty() ? "missing TRACE argument (a file, or - for stdin)"
                                          : "expected exactly one TRACE argument");
  }
  // A size such as 9.05GiB need not be a multiple of the granularity: use what fits.
  if (alignment != 0 && capacity >= alignment) capacity -= capacity % alignment;
  if (absl::Status st = Arena::create(capacity, alignment).status(); !st.ok()) {
    return flags.usage_error(absl::StrCat("--capacity/--align: ", st.message()));
  }

  auto fail = [](const absl::Status& st) {
    return cli::print_error("arena-replay", std::string(st.message()));
  };
  const std::string& name = args[0];
  absl::StatusOr<std::string> data = read_all(name);
  if (!data.ok()) return fail(data.status());
  absl::StatusOr<Trace> trace = parse_trace(*data, name == "-" ? "<stdin>" : name);
  if (!trace.ok()) return fail(trace.status());

  const bool compacting = compaction == "on";
  absl::StatusOr<Replay> result = replay(*trace, capacity, alignment, compacting);
  if (!result.ok()) return fail(result.status());
  uint64_t failed_without = result->failed;
  if (compacting) {
    absl::StatusOr<Replay> plain = replay(*trace, capacity, alignment, false);
    if (!plain.ok()) return fail(plain.status());
    failed_without = plain->failed;
  }
  if (json) {
    print_json(*trace, capacity, alignment, compacting, *result, failed_without);
  } else {
    print_table(name, *trace, capacity, alignment, compacting, *result, failed_without);
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::run(argc, argv); }
