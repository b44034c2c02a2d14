// Captures strata's log lines for one scope (log::set_sink_for_testing) and restores the
// threshold it found. One capture at a time per process; tests run on one thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "strata/base/log.h"

namespace strata::testing {

class LogCapture {
 public:
  LogCapture() : saved_threshold_(log::threshold()) {
    lines().clear();
    log::set_sink_for_testing(&LogCapture::sink);
  }
  ~LogCapture() {
    log::set_sink_for_testing(nullptr);
    log::set_threshold(saved_threshold_);
    lines().clear();
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Every line written since construction, each with its trailing newline.
  const std::vector<std::string>& all() const { return lines(); }
  // The lines containing `part`.
  std::vector<std::string> matching(std::string_view part) const {
    std::vector<std::string> out;
    for (const std::string& line : lines()) {
      if (line.find(part) != std::string::npos) out.push_back(line);
    }
    return out;
  }

 private:
  static std::vector<std::string>& lines() {
    static std::vector<std::string> captured;
    return captured;
  }
  static void sink(LogLevel /*level*/, std::string_view line) { lines().emplace_back(line); }

  LogLevel saved_threshold_;
};

}  // namespace strata::testing
