#include "strata/comm/launch.h"

#include <absl/status/status.h>
#include <absl/strings/numbers.h>

#include <cstdlib>
#include <vector>

#include "strata/base/text.h"

namespace strata {
namespace {

using namespace text;  // NOLINT(build/namespaces): string_view helpers

constexpr const char* kNames[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};

// An integer in [min, max]; `what` says what the variable holds.
bool parse_int(const std::map<std::string, std::string>& vars, const std::string& name, int64_t min,
               int64_t max, std::string_view form, int64_t& out, std::vector<std::string>& errors) {
  const auto it = vars.find(name);
  if (it == vars.end()) return false;
  int64_t value = 0;
  if (!absl::SimpleAtoi(to_absl(trim(it->second)), &value) || value < min || value > max) {
    errors.push_back(cat(name, "='", it->second, "' is not ", form));
    return false;
  }
  out = value;
  return true;
}

}  // namespace

absl::StatusOr<LaunchInfo> LaunchInfo::from_variables(
    const std::map<std::string, std::string>& vars) {
  LaunchInfo info;
  std::vector<std::string> errors;
  int64_t world = 1;
  const bool has_world = parse_int(vars, "WORLD_SIZE", 1, 1 << 20,
                                   "a rank count: use an integer of at least 1", world, errors);
  int64_t rank = 0;
  const bool has_rank = parse_int(vars, "RANK", 0, (1 << 20) - 1,
                                  "a rank: use an integer from 0 to WORLD_SIZE-1", rank, errors);
  int64_t local_rank = rank;
  const bool has_local =
      parse_int(vars, "LOCAL_RANK", 0, (1 << 20) - 1, "a local rank: use an integer of at least 0",
                local_rank, errors);
  int64_t port = info.master_port;
  parse_int(vars, "MASTER_PORT", 1, 65535, "a TCP port: use an integer from 1 to 65535", port,
            errors);
  if (const auto it = vars.find("MASTER_ADDR"); it != vars.end()) {
    if (trim(it->second).empty()) {
      errors.push_back(
          "MASTER_ADDR is set but empty: set it to the host name or IP address of rank 0, or "
          "unset it for 127.0.0.1");
    } else {
      info.master_addr = std::string(trim(it->second));
    }
  }
  if (has_rank != has_world && errors.empty()) {
    errors.push_back(has_rank ? cat("RANK=", rank,
                                    " is set but WORLD_SIZE is not: a launcher sets both (set "
                                    "WORLD_SIZE to the number of ranks, or unset RANK)")
                              : cat("WORLD_SIZE=", world,
                                    " is set but RANK is not: a launcher sets both (set RANK "
                                    "to this process's rank, or unset WORLD_SIZE)"));
  }
  if (has_rank && has_world && rank >= world) {
    errors.push_back(cat("RANK=", rank, " is not below WORLD_SIZE=", world,
                         ": ranks run from 0 to WORLD_SIZE-1"));
  }
  if (!errors.empty()) {
    std::string message =
        errors.size() == 1 ? errors.front() : cat(errors.size(), " launch variable errors:");
    if (errors.size() > 1) {
      for (const std::string& e : errors) message += cat("\n  ", e);
    }
    return absl::InvalidArgumentError(to_absl(message));
  }
  info.rank = static_cast<int>(rank);
  info.world_size = static_cast<int>(world);
  info.local_rank = static_cast<int>(has_local ? local_rank : rank);
  // A job of one rank that names no port serves its rendezvous on a free one: nothing else
  // joins it, and two lone trainers on one machine must not collide on the default port.
  info.master_port = world == 1 && vars.count("MASTER_PORT") == 0 ? 0 : static_cast<uint16_t>(port);
  info.launched = has_rank || has_world;
  return info;
}

absl::StatusOr<LaunchInfo> LaunchInfo::from_environment() {
  std::map<std::string, std::string> vars;
  for (const char* name : kNames) {
    if (const char* value = std::getenv(name); value != nullptr) vars.emplace(name, value);
  }
  return from_variables(vars);
}

}  // namespace strata
