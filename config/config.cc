#include "strata/config/config.h"

#include <absl/status/status.h>
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <set>

#include "config_internal.h"
#include "strata/base/log.h"
#include "strata/base/text.h"
#include "strata/config/slurm.h"
#include "strata/nvme/io_engine.h"

extern char** environ;

namespace strata {
namespace {

using namespace config_internal;  // NOLINT(build/namespaces): this file implements it

using namespace text;  // std::string_view helpers (Debian's Abseil has its own string_view)

constexpr std::string_view kLocalRankForm =
    "use an integer from 0 to LOCAL_WORLD_SIZE-1 (torchrun and strata-run set it)";
constexpr std::string_view kLocalWorldSizeForm =
    "use the number of ranks on this node, an integer of at least 1 (torchrun and strata-run "
    "set it)";

constexpr std::string_view kIoBlockForm =
    "use a positive multiple of 4KiB up to 64MiB (e.g. 256KiB, 1MiB, 4MiB)";

bool io_block_ok(uint64_t bytes) {
  return bytes > 0 && bytes % kIoBlockAlignment == 0 && bytes <= kMaxIoBlock;
}

// A byte size where percentages make no sense (no total to take them of).
absl::StatusOr<uint64_t> parse_plain_size(std::string_view text) {
  absl::StatusOr<SizeSetting> setting = parse_size_setting(text, /*allow_percent=*/false);
  if (!setting.ok()) return setting.status();
  return setting->bytes;
}

// Looks up an enum word, case-insensitively.
template <typename E>
absl::StatusOr<E> parse_word(std::string_view text, std::string_view what,
                             std::initializer_list<std::pair<std::string_view, E>> words) {
  const std::string word = lower(trim(text));
  std::vector<std::string_view> names;
  for (const auto& [w, value] : words) {
    if (w == word) return value;
    names.push_back(w);
  }
  const std::string last(names.back());
  names.pop_back();
  return invalid(cat("'", text, "' is not ", what, ": use ", join(names, ", "), " or ", last));
}

absl::StatusOr<int64_t> parse_integer(std::string_view text, int64_t min, int64_t max,
                                      std::string_view what) {
  const std::string range = max == std::numeric_limits<int>::max()
                                ? cat("an integer of at least ", min)
                                : cat("an integer from ", min, " to ", max);
  int64_t value = 0;
  if (!absl::SimpleAtoi(to_absl(trim(text)), &value)) {
    return invalid(cat("'", text, "' is not ", what, ": use ", range));
  }
  if (value < min || value > max) {
    return invalid(cat("'", text, "' is out of range: use ", range));
  }
  return value;
}

// A STRATA_ name that strata does not read. A near miss of a real name (a typo, the wrong case)
// is an error, since the setting the user meant would silently not apply. Anything further is
// probably another program's variable (a wrapper script's STRATA_BUILD_TYPE): a warning, once.
absl::Status unknown_variable(std::string_view name, std::string_view value) {
  std::vector<std::string_view> candidates = known_variables();
  candidates.insert(candidates.end(), std::begin(kLoaderVariables), std::end(kLoaderVariables));
  const Nearest nearest_known = nearest(upper(name), candidates);
  const std::string_view best = nearest_known.name;
  const size_t best_distance = nearest_known.distance;
  const std::string head = cat(name, "='", value, "' is not a strata variable: ");
  if (best_distance == 0) {
    return invalid(cat(head, "did you mean ", best, "? (names are upper case)"));
  }
  // Allow about one edit per three characters after STRATA_, so STRATA_FOO is not "LOG".
  const size_t allowed = std::clamp<size_t>((name.size() - kPrefix.size()) / 3, 1, 3);
  if (best_distance <= allowed) {
    return invalid(cat(head, "did you mean ", best,
                       "? Fix the name or unset it; docs/configuration.md lists them"));
  }
  log::warn_once(cat(head, "ignored (strata reads ", join(known_variables(), ", "),
                     "; a name within a few letters of one of them would be an error)"));
  return absl::OkStatus();
}

// Checks a size setting's own value (not against the machine).
void check_setting(const SizeSetting& setting, std::string_view name, Errors& errors) {
  if (setting.is_percent) {
    // Of the largest total, so that only the range is judged (0.5% of 100 bytes is 0 bytes).
    errors.add(setting.resolve(std::numeric_limits<uint64_t>::max(), name).status());
  } else if (setting.bytes == 0) {
    errors.add(invalid(cat(name, "=0 is zero: sizes must be positive")));
  }
}

// Empty entries and duplicates; `shown` is the list as the user wrote it.
absl::Status check_paths(const std::vector<std::string>& paths, std::string_view shown) {
  std::set<std::string_view> seen;
  for (const std::string& path : paths) {
    if (path.empty()) {
      return invalid(cat("'", shown,
                         "' has an empty entry: separate directories with single commas and "
                         "leave no comma at either end"));
    }
    if (!seen.insert(path).second) {
      return invalid(cat("'", shown, "' lists '", path,
                         "' twice: give each directory once (stripes spread over distinct "
                         "directories)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void config_internal::validate_values(const Config& c, Errors& errors) {
  if (c.device && *c.device < 0) {
    errors.add(invalid(
        cat(kDevice, "=", *c.device, " is negative: use a CUDA device ordinal (0, 1, ...)")));
  }
  if (c.gpu_bytes) check_setting(*c.gpu_bytes, kGpuBytes, errors);
  check_setting(c.cpu_bytes, kCpuBytes, errors);
  check_setting(c.nvme_bytes, kNvmeBytes, errors);
  errors.add_prefixed(kNvmePaths, check_paths(c.nvme_paths, join(c.nvme_paths, ",")));
  errors.add_prefixed(kIoDepth, check_io_depth(c.io_depth));  // the NVMe floor's one check
  const bool block_ok = io_block_ok(c.io_block);
  if (!block_ok) {
    errors.add(
        invalid(cat(kIoBlock, "=", size_text(c.io_block), " is not allowed: ", kIoBlockForm)));
  }
  if (c.comm.timeout < kMinCommTimeout || c.comm.timeout > kMaxCommTimeout) {
    errors.add(
        invalid(cat(kCommTimeout, "=", format_duration(c.comm.timeout), " is out of range: use ",
                    format_duration(kMinCommTimeout), " to ", format_duration(kMaxCommTimeout))));
  }
  if (c.adam_pool.threads > kMaxPoolCpus) {
    errors.add(invalid(cat(kAdamThreads, "=", c.adam_pool.threads,
                           " is out of range: use an integer from 0 to ", kMaxPoolCpus)));
  }
  if (c.adam_pool.reserve_cores >= kMaxPoolCpus) {
    errors.add(invalid(cat(kAdamReserveCores, "=", c.adam_pool.reserve_cores,
                           " is out of range: use an integer from 0 to ", kMaxPoolCpus - 1)));
  }
  const LocalRanks& local = c.local;
  if (local.rank && (*local.rank < 0 || *local.rank >= kMaxLocalRanks)) {
    errors.add(invalid(cat(kLocalRank, "=", *local.rank, " is out of range: ", kLocalRankForm)));
  }
  if (local.world_size && (*local.world_size < 1 || *local.world_size > kMaxLocalRanks)) {
    errors.add(invalid(
        cat(kLocalWorldSize, "=", *local.world_size, " is out of range: ", kLocalWorldSizeForm)));
  } else if (local.rank && local.world_size && *local.rank >= *local.world_size) {
    errors.add(invalid(cat(kLocalRank, "=", *local.rank, " is not below ", kLocalWorldSize, "=",
                           *local.world_size, ": local ranks run from 0 to ", kLocalWorldSize,
                           "-1 (a launcher sets both; check the one that started this process)")));
  }
  if (c.staging_bytes == 0) {
    errors.add(invalid(cat(kStagingBytes, "=0 is zero: sizes must be positive")));
  } else if (block_ok && c.staging_bytes < c.io_block) {
    errors.add(invalid(cat(kStagingBytes, "=", size_text(c.staging_bytes), " is smaller than ",
                           kIoBlock, "=", size_text(c.io_block),
                           ": staging must hold at least one I/O block; raise ", kStagingBytes,
                           " or lower ", kIoBlock)));
  }
}

namespace {

using Parser = std::function<absl::Status(Config&, std::string_view)>;

// Parses `value` with `parse` (a function returning StatusOr<T>) and stores it with `store`.
template <typename ParseFn, typename StoreFn>
Parser field(ParseFn parse, StoreFn store) {
  return [parse, store](Config& c, std::string_view value) -> absl::Status {
    auto parsed = parse(value);
    if (!parsed.ok()) return parsed.status();
    store(c, *std::move(parsed));
    return absl::OkStatus();
  };
}

absl::Status parse_nvme_paths(Config& c, std::string_view value) {
  c.nvme_paths.clear();
  if (trim(value).empty()) return absl::OkStatus();  // no NVMe tier
  for (absl::string_view entry : absl::StrSplit(to_absl(value), ',')) {
    c.nvme_paths.emplace_back(trim(to_std(entry)));
  }
  // Checked here too so that the message quotes the text as the user wrote it.
  return check_paths(c.nvme_paths, value);
}

struct Variable {
  std::string_view name;
  std::string_view default_text;
  Parser parse;
};

const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = {
      {kBackend, "auto", field(parse_backend, [](Config& c, Backend v) { c.backend = v; })},
      {kDevice, "LOCAL_RANK when set, else 0",
       field(
           [](std::string_view t) {
             return parse_integer(t, 0, std::numeric_limits<int>::max(), "a CUDA device ordinal");
           },
           [](Config& c, int64_t v) { c.device = static_cast<int>(v); })},
      {kGpuBytes, "80% on cuda, 1GiB on host",
       field([](std::string_view t) { return parse_size_setting(t, true); },
             [](Config& c, SizeSetting v) { c.gpu_bytes = v; })},
      {kCpuBytes, "25%",
       field([](std::string_view t) { return parse_size_setting(t, true); },
             [](Config& c, SizeSetting v) { c.cpu_bytes = v; })},
      {kNvmePaths, "empty: no NVMe tier", parse_nvme_paths},
      {kNvmeBytes, "8GiB",
       field([](std::string_view t) { return parse_size_setting(t, true); },
             [](Config& c, SizeSetting v) { c.nvme_bytes = v; })},
      {kIoEngine, "auto",
       field(parse_io_engine, [](Config& c, IoEngineKind v) { c.io_engine = v; })},
      {kIoDepth, "32",
       field(
           [](std::string_view t) -> absl::StatusOr<int64_t> {
             int64_t depth = 0;
             if (!absl::SimpleAtoi(to_absl(trim(t)), &depth)) {
               return invalid(
                   cat("'", t, "' is not a depth: use an integer from 1 to ", kMaxIoDepth));
             }
             if (absl::Status s = check_io_depth(depth); !s.ok()) return s;
             return depth;
           },
           [](Config& c, int64_t v) { c.io_depth = static_cast<uint32_t>(v); })},
      {kIoBlock, "1MiB",
       field(
           [](std::string_view t) -> absl::StatusOr<uint64_t> {
             absl::StatusOr<uint64_t> bytes = parse_plain_size(t);
             if (bytes.ok() && !io_block_ok(*bytes)) {
               return invalid(cat("'", t, "' (", *bytes, " bytes) is not allowed: ", kIoBlockForm));
             }
             return bytes;
           },
           [](Config& c, uint64_t v) { c.io_block = v; })},
      {kStagingBytes, "256MiB",
       field(parse_plain_size, [](Config& c, uint64_t v) { c.staging_bytes = v; })},
      {kVerify, "on", field(parse_switch, [](Config& c, bool v) { c.verify = v; })},
      {kLog, "warn", field(parse_log_level, [](Config& c, LogLevel v) { c.log = v; })},
      {kCommBackend, "auto",
       field(parse_comm_backend, [](Config& c, CommBackendKind v) { c.comm.backend = v; })},
      {kCommTimeout, "300s",
       field(parse_comm_timeout,
             [](Config& c, std::chrono::milliseconds v) { c.comm.timeout = v; })},
      {kCommDebug, "off", field(parse_switch, [](Config& c, bool v) { c.comm.debug = v; })},
      {kAdamThreads, "0: every CPU of the states' NUMA node",
       field([](std::string_view t) { return parse_integer(t, 0, kMaxPoolCpus, "a thread count"); },
             [](Config& c, int64_t v) { c.adam_pool.threads = static_cast<uint32_t>(v); })},
      {kAdamReserveCores, "0",
       field(
           [](std::string_view t) {
             return parse_integer(t, 0, kMaxPoolCpus - 1, "a number of cores");
           },
           [](Config& c, int64_t v) { c.adam_pool.reserve_cores = static_cast<uint32_t>(v); })},
      {kAdamPin, "on", field(parse_switch, [](Config& c, bool v) { c.adam_pool.pin = v; })},
  };
  return table;
}

// The launch variables read with the STRATA_* ones (LocalRanks). Malformed values are errors
// that name them, as comm/launch.cc reports the others.
const std::vector<Variable>& launch_variables() {
  static const std::vector<Variable> table = {
      {kLocalRank, "unset",
       field(
           [](std::string_view t) -> absl::StatusOr<int64_t> {
             int64_t v = 0;
             if (!absl::SimpleAtoi(to_absl(trim(t)), &v) || v < 0 || v >= kMaxLocalRanks) {
               return invalid(cat("'", t, "' is not a local rank: ", kLocalRankForm));
             }
             return v;
           },
           [](Config& c, int64_t v) { c.local.rank = static_cast<int>(v); })},
      {kLocalWorldSize, "unset",
       field(
           [](std::string_view t) -> absl::StatusOr<int64_t> {
             int64_t v = 0;
             if (!absl::SimpleAtoi(to_absl(trim(t)), &v) || v < 1 || v > kMaxLocalRanks) {
               return invalid(cat("'", t, "' is not a rank count: ", kLocalWorldSizeForm));
             }
             return v;
           },
           [](Config& c, int64_t v) { c.local.world_size = static_cast<int>(v); })},
  };
  return table;
}

}  // namespace

std::string_view to_string(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "invalid";
}

absl::StatusOr<Backend> parse_backend(std::string_view text) {
  return parse_word<Backend>(
      text, "a backend",
      {{"auto", Backend::kAuto}, {"cuda", Backend::kCuda}, {"host", Backend::kHost}});
}

absl::StatusOr<IoEngineKind> parse_io_engine(std::string_view text) {
  return parse_word<IoEngineKind>(text, "an I/O engine",
                                  {{"auto", IoEngineKind::kAuto},
                                   {"io_uring", IoEngineKind::kIoUring},
                                   {"psync", IoEngineKind::kPsync}});
}

absl::StatusOr<LogLevel> parse_log_level(std::string_view text) {
  return parse_word<LogLevel>(text, "a log level",
                              {{"error", LogLevel::kError},
                               {"warn", LogLevel::kWarn},
                               {"info", LogLevel::kInfo},
                               {"debug", LogLevel::kDebug}});
}

absl::StatusOr<bool> parse_switch(std::string_view text) {
  const std::string word = lower(trim(text));
  for (std::string_view on : {"on", "1", "true", "yes"}) {
    if (word == on) return true;
  }
  for (std::string_view off : {"off", "0", "false", "no"}) {
    if (word == off) return false;
  }
  return invalid(cat("'", text,
                     "' is not a switch: use on or off (also 1/0, true/false, "
                     "yes/no)"));
}

const std::vector<std::string_view>& known_variables() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> result;
    for (const Variable& v : variables()) result.push_back(v.name);
    return result;
  }();
  return names;
}

absl::StatusOr<Config> Config::from_variables(const std::map<std::string, std::string>& vars) {
  Config config;
  Errors errors;
  for (const Variable& v : variables()) {
    const auto it = vars.find(std::string(v.name));
    if (it == vars.end()) continue;
    if (trim(it->second).empty() && v.name != kNvmePaths) {
      errors.add(invalid(cat(v.name, " is set but empty: unset it to use the default (",
                             v.default_text, ") or give a value")));
      continue;
    }
    errors.add_prefixed(v.name, v.parse(config, it->second));
  }
  for (const Variable& v : launch_variables()) {
    const auto it = vars.find(std::string(v.name));
    if (it != vars.end()) errors.add_prefixed(v.name, v.parse(config, it->second));
  }
  // Under srun, SLURM_LOCALID and the tasks per node stand in for LOCAL_RANK and
  // LOCAL_WORLD_SIZE where no torch launch variable is set (strata/config/slurm.h).
  if (!has_torch_launch_variable(vars)) {
    absl::StatusOr<std::optional<SlurmTask>> task = slurm_task(vars);
    if (!task.ok()) {
      errors.add(task.status());
    } else if (task->has_value()) {
      config.local.rank = (*task)->local_rank;
      config.local.world_size = (*task)->local_world_size;
      config.local.source = (*task)->description;
    }
  }
  for (const auto& [name, value] : vars) {
    if (!name.starts_with(kPrefix)) continue;
    const auto& known = known_variables();
    if (std::find(known.begin(), known.end(), name) == known.end() &&
        std::find(std::begin(kLoaderVariables), std::end(kLoaderVariables), name) ==
            std::end(kLoaderVariables)) {
      errors.add(unknown_variable(name, value));
    }
  }
  // Range checks only where every variable parsed: a parse error already names the variable.
  if (errors.empty()) validate_values(config, errors);
  if (!errors.empty()) return errors.status();
  return config;
}

absl::StatusOr<Config> Config::from_environment() {
  return from_variables(environment_variables());
}

std::map<std::string, std::string> Config::environment_variables() {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const size_t equals = text.find('=');
    if (equals == std::string_view::npos) continue;
    const std::string_view name = text.substr(0, equals);
    if (name.starts_with(kPrefix) || name == kLocalRank || name == kLocalWorldSize ||
        name == "RANK" || name == "WORLD_SIZE" || is_slurm_task_variable(name)) {
      vars.emplace(name, text.substr(equals + 1));
    }
  }
  return vars;
}

}  // namespace strata
