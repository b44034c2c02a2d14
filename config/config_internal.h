// Shared by config.cc (parsing) and resolve.cc (checks against the machine): variable names,
// error collection and the checks that need no machine facts.
#pragma once

#include <absl/status/status.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/text.h"
#include "strata/config/config.h"

namespace strata::config_internal {

using text::cat;
using text::to_absl;

inline constexpr std::string_view kBackend = "STRATA_BACKEND";
inline constexpr std::string_view kDevice = "STRATA_DEVICE";
inline constexpr std::string_view kGpuBytes = "STRATA_GPU_BYTES";
inline constexpr std::string_view kCpuBytes = "STRATA_CPU_BYTES";
inline constexpr std::string_view kNvmePaths = "STRATA_NVME_PATHS";
inline constexpr std::string_view kNvmeBytes = "STRATA_NVME_BYTES";
inline constexpr std::string_view kIoEngine = "STRATA_IO_ENGINE";
inline constexpr std::string_view kIoDepth = "STRATA_IO_DEPTH";
inline constexpr std::string_view kIoBlock = "STRATA_IO_BLOCK";
inline constexpr std::string_view kStagingBytes = "STRATA_STAGING_BYTES";
inline constexpr std::string_view kVerify = "STRATA_VERIFY";
inline constexpr std::string_view kLog = "STRATA_LOG";
inline constexpr std::string_view kCommBackend = "STRATA_COMM_BACKEND";
inline constexpr std::string_view kCommTimeout = "STRATA_COMM_TIMEOUT";
inline constexpr std::string_view kCommDebug = "STRATA_COMM_DEBUG";
inline constexpr std::string_view kAdamThreads = "STRATA_ADAM_THREADS";
inline constexpr std::string_view kAdamReserveCores = "STRATA_ADAM_RESERVE";
inline constexpr std::string_view kAdamPin = "STRATA_ADAM_PIN";
inline constexpr std::string_view kPrefix = "STRATA_";
// Read where they are used, not by Config: the NCCL loader's (comm/nccl_library.cc), the
// auto agreement's test hook (comm/backend_agreement.cc) and ZeRO's hpZ switch
// (offload/zero_collectives.cc). Known, so never "not a strata variable".
inline constexpr std::string_view kLoaderVariables[] = {
    "STRATA_NCCL_LIBRARY", "STRATA_NCCL_SEARCH_PATH", "STRATA_TESTING_CLAIM_NCCL",
    "STRATA_ZERO_HPZ"};

// Collects every error; the combined status carries the first error's code.
class Errors {
 public:
  void add(const absl::Status& status) {
    if (!status.ok()) list_.push_back(status);
  }
  // `name`=`value` prefixed to a parser's message, which starts with the quoted value.
  void add_prefixed(std::string_view name, const absl::Status& status) {
    if (!status.ok()) list_.emplace_back(status.code(), cat(name, "=", status.message()));
  }
  bool empty() const { return list_.empty(); }
  absl::Status status() const {
    if (list_.empty()) return absl::OkStatus();
    if (list_.size() == 1) return list_.front();
    std::string message = cat(list_.size(), " configuration errors:");
    for (const absl::Status& s : list_) message += cat("\n  ", s.message());
    return absl::Status(list_.front().code(), message);
  }

 private:
  std::vector<absl::Status> list_;
};

inline absl::Status invalid(std::string_view message) {
  return absl::InvalidArgumentError(to_absl(message));
}

// "1MiB" where a binary unit fits exactly, else the plain byte count ("1000").
inline std::string size_text(uint64_t bytes) {
  std::string text = SizeSetting::of_bytes(bytes).to_string();
  return text.ends_with("iB") ? text : cat(bytes);
}
// Checks that need no machine facts (ranges, empty or repeated paths, staging vs. I/O block);
// run by from_variables() and again by resolve() for values set from C++.
void validate_values(const Config& config, Errors& errors);

}  // namespace strata::config_internal
