#include "strata/base/log.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/ascii.h>
#include <absl/synchronization/mutex.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "strata/base/mutex.h"

namespace strata::log {
namespace {

std::string_view level_word(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

// STRATA_LOG as the process started; Config validates it and names a malformed value.
LogLevel initial_threshold() {
  const char* value = std::getenv("STRATA_LOG");
  if (value == nullptr) return LogLevel::kWarn;
  const std::string word = absl::AsciiStrToLower(value);
  if (word == "error") return LogLevel::kError;
  if (word == "info") return LogLevel::kInfo;
  if (word == "debug") return LogLevel::kDebug;
  return LogLevel::kWarn;
}

std::atomic<int>& threshold_value() {
  static std::atomic<int> value{static_cast<int>(initial_threshold())};
  return value;
}

struct State {
  absl::Mutex mu;
  Sink sink ABSL_GUARDED_BY(mu) = nullptr;
  absl::flat_hash_set<std::string> warned ABSL_GUARDED_BY(mu);
};

State& state() {
  static State* s = new State();  // never destroyed: logging may run during static teardown
  return *s;
}

}  // namespace

LogLevel threshold() {
  return static_cast<LogLevel>(threshold_value().load(std::memory_order_relaxed));
}

void set_threshold(LogLevel level) {
  threshold_value().store(static_cast<int>(level), std::memory_order_relaxed);
}

void write(LogLevel level, std::string_view message) {
  if (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  // Debian's Abseil has its own string_view, so the line is assembled with std::string.
  std::string line = "strata: ";
  line.append(level_word(level)).append(": ").append(message).append("\n");
  State& s = state();
  MutexLock lock(&s.mu);
  if (s.sink != nullptr) {
    s.sink(level, line);
    return;
  }
  // One fwrite per line, under the lock, so lines from several threads never interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void warn_once(std::string_view message) {
  if (!enabled(LogLevel::kWarn)) return;
  {
    State& s = state();
    MutexLock lock(&s.mu);
    if (!s.warned.emplace(message).second) return;
  }
  write(LogLevel::kWarn, message);
}

void set_sink_for_testing(Sink sink) {
  State& s = state();
  MutexLock lock(&s.mu);
  s.sink = sink;
}

}  // namespace strata::log
