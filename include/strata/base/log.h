// Logging: one line per message to stderr, prefixed "strata: <level>: ".
//
// A small sink rather than spdlog: strata's messages are rare (warnings, decisions, debug traces
// of tier moves), already formatted with absl::StrFormat everywhere else, and a logging library
// would add a second format syntax and a public dependency of the installed package.
//
// The threshold starts from STRATA_LOG (read once, on first use; a malformed value is reported
// by Config and leaves the default, warn) and Runtime sets it from its Config. Thread-safe.
#pragma once

#include <absl/strings/str_format.h>

#include <string>
#include <string_view>

namespace strata {

// Lower is more severe; a message prints when its level <= the threshold.
enum class LogLevel { kError, kWarn, kInfo, kDebug };

namespace log {

LogLevel threshold();
void set_threshold(LogLevel level);
inline bool enabled(LogLevel level) { return level <= threshold(); }

// Writes one line (a trailing newline in `message` is not doubled).
void write(LogLevel level, std::string_view message);
// A warning printed at most once per process for the same text (later calls count silently):
// the psync fallback or a shrunk budget is said once, not per runtime a test creates.
void warn_once(std::string_view message);

// Where lines go: stderr by default; tests capture them. Empty function: back to stderr.
using Sink = void (*)(LogLevel level, std::string_view line);
void set_sink_for_testing(Sink sink);

}  // namespace log
}  // namespace strata

// Formats only when the level is enabled, so debug traces cost a load and a compare otherwise.
#define STRATA_LOG(level, ...)                                                       \
  do {                                                                               \
    if (::strata::log::enabled(::strata::LogLevel::level))                           \
      ::strata::log::write(::strata::LogLevel::level, absl::StrFormat(__VA_ARGS__)); \
  } while (0)
