#include "strata/comm/launch.h"

#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "strata/base/text.h"
#include "strata/config/slurm.h"

namespace strata {
namespace {

using namespace text;  // NOLINT(build/namespaces): string_view helpers

constexpr std::string_view kNames[] = {"RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "GROUP_WORLD_SIZE",
                                       "ROLE_RANK",
                                       "ROLE_WORLD_SIZE",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       "TORCHELASTIC_USE_AGENT_STORE",
                                       "TORCHELASTIC_RESTART_COUNT",
                                       "TORCHELASTIC_RUN_ID"};

constexpr int64_t kMaxRanks = 1 << 20;

// An integer in [min, max] from `name`, if set; a malformed one is added to `errors`.
std::optional<int64_t> parse_int(const std::map<std::string, std::string>& vars,
                                 std::string_view name, int64_t min, int64_t max,
                                 std::string_view form, std::vector<std::string>& errors) {
  const auto it = vars.find(std::string(name));
  if (it == vars.end()) return std::nullopt;
  int64_t value = 0;
  if (!absl::SimpleAtoi(to_absl(trim(it->second)), &value) || value < min || value > max) {
    errors.push_back(cat(name, "='", it->second, "' is not ", form));
    return std::nullopt;
  }
  return value;
}

// torch writes str(bool): "True" or "False".
std::optional<bool> parse_bool(const std::map<std::string, std::string>& vars,
                               std::string_view name, std::vector<std::string>& errors) {
  const auto it = vars.find(std::string(name));
  if (it == vars.end()) return std::nullopt;
  const std::string word = lower(trim(it->second));
  if (word == "true" || word == "1") return true;
  if (word == "false" || word == "0" || word.empty()) return false;
  errors.push_back(cat(name, "='", it->second, "' is not True or False (torchrun sets it)"));
  return std::nullopt;
}

// `a` (named a_name) must be below `b` (b_name) where both are set.
void check_below(std::optional<int64_t> a, std::string_view a_name, std::optional<int64_t> b,
                 std::string_view b_name, std::vector<std::string>& errors) {
  if (a && b && *a >= *b) {
    errors.push_back(cat(a_name, "=", *a, " is not below ", b_name, "=", *b, ": it runs from 0 to ",
                         b_name,
                         "-1 (a launcher sets both; check the one that started this "
                         "process)"));
  }
}

}  // namespace

bool is_torch_launch_variable(std::string_view name) {
  for (std::string_view n : kNames) {
    if (n == name) return true;
  }
  // Set by torchrun to describe the launch, not read here.
  return name == "ROLE_NAME" || name == "TORCHELASTIC_MAX_RESTARTS";
}

bool is_launch_variable(std::string_view name) {
  if (name == "ROLE_NAME" || name == "TORCHELASTIC_MAX_RESTARTS") return false;
  return is_torch_launch_variable(name) || is_slurm_task_variable(name);
}

absl::StatusOr<LaunchInfo> LaunchInfo::from_variables(
    const std::map<std::string, std::string>& vars) {
  LaunchInfo info;
  std::vector<std::string> errors;
  std::optional<int64_t> world = parse_int(vars, "WORLD_SIZE", 1, kMaxRanks,
                                           "a rank count: use an integer of at least 1", errors);
  std::optional<int64_t> rank = parse_int(vars, "RANK", 0, kMaxRanks - 1,
                                          "a rank: use an integer from 0 to WORLD_SIZE-1", errors);
  std::optional<int64_t> local_rank = parse_int(
      vars, "LOCAL_RANK", 0, kMaxRanks - 1, "a local rank: use an integer of at least 0", errors);
  std::optional<int64_t> local_world = parse_int(
      vars, "LOCAL_WORLD_SIZE", 1, kMaxRanks, "a rank count: use an integer of at least 1", errors);
  const std::optional<int64_t> group_rank = parse_int(
      vars, "GROUP_RANK", 0, kMaxRanks - 1, "a node index: use an integer of at least 0", errors);
  const std::optional<int64_t> group_world = parse_int(
      vars, "GROUP_WORLD_SIZE", 1, kMaxRanks, "a node count: use an integer of at least 1", errors);
  const std::optional<int64_t> role_rank = parse_int(
      vars, "ROLE_RANK", 0, kMaxRanks - 1, "a rank: use an integer of at least 0", errors);
  const std::optional<int64_t> role_world = parse_int(
      vars, "ROLE_WORLD_SIZE", 1, kMaxRanks, "a rank count: use an integer of at least 1", errors);
  const std::optional<int64_t> port = parse_int(
      vars, "MASTER_PORT", 1, 65535, "a TCP port: use an integer from 1 to 65535", errors);
  const std::optional<bool> agent_store = parse_bool(vars, "TORCHELASTIC_USE_AGENT_STORE", errors);
  const std::optional<int64_t> restarts =
      parse_int(vars, "TORCHELASTIC_RESTART_COUNT", 0, int64_t{1} << 30,
                "a restart count: use an integer of at least 0", errors);
  const bool has_addr = vars.count("MASTER_ADDR") != 0;
  if (has_addr) {
    const std::string& addr = vars.at("MASTER_ADDR");
    if (trim(addr).empty()) {
      errors.push_back(
          "MASTER_ADDR is set but empty: set it to the host name or IP address of rank 0, or "
          "unset it for 127.0.0.1");
    } else {
      info.master_addr = std::string(trim(addr));
    }
  }

  // srun's variables stand in for torch's where none of those is set (strata/config/slurm.h).
  std::optional<SlurmTask> slurm;
  if (!has_torch_launch_variable(vars)) {
    absl::StatusOr<std::optional<SlurmTask>> task = slurm_task(vars);
    if (!task.ok()) {
      errors.emplace_back(task.status().message());
    } else {
      slurm = *task;
    }
  }
  if (slurm) {
    rank = slurm->rank;
    world = slurm->world_size;
    local_rank = slurm->local_rank;
    if (slurm->local_world_size) local_world = *slurm->local_world_size;
    if (slurm->node) info.node_rank = *slurm->node;
    if (slurm->world_size > 1 && (!has_addr || !port)) {
      errors.push_back(cat(slurm->description, ": ",
                           !has_addr && !port ? "MASTER_ADDR and MASTER_PORT are"
                           : !has_addr        ? "MASTER_ADDR is"
                                              : "MASTER_PORT is",
                           " not set (Slurm does not set them, and rank 0 serves the rendezvous "
                           "there): ",
                           kSlurmMasterHint));
    }
  }

  if (rank.has_value() != world.has_value() && errors.empty()) {
    errors.push_back(rank ? cat("RANK=", *rank,
                                " is set but WORLD_SIZE is not: a launcher sets both (set "
                                "WORLD_SIZE to the number of ranks, or unset RANK)")
                          : cat("WORLD_SIZE=", *world,
                                " is set but RANK is not: a launcher sets both (set RANK "
                                "to this process's rank, or unset WORLD_SIZE)"));
  }
  if (rank && world && *rank >= *world) {
    errors.push_back(cat("RANK=", *rank, " is not below WORLD_SIZE=", *world,
                         ": ranks run from 0 to WORLD_SIZE-1"));
  }
  if (!slurm) {
    check_below(local_rank, "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE", errors);
    check_below(group_rank, "GROUP_RANK", group_world, "GROUP_WORLD_SIZE", errors);
  }
  check_below(role_rank, "ROLE_RANK", role_world, "ROLE_WORLD_SIZE", errors);
  if (local_world && world && *local_world > *world) {
    errors.push_back(cat("LOCAL_WORLD_SIZE=", *local_world, " is more than WORLD_SIZE=", *world,
                         ": a node cannot hold more ranks than the job"));
  }
  if (agent_store.value_or(false) && (!has_addr || !port)) {
    errors.push_back(
        "TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR or MASTER_PORT is unset: torchrun sets "
        "all three (its agent serves a store there); set them as the launcher that started this "
        "process should have, or unset TORCHELASTIC_USE_AGENT_STORE");
  }
  if (!errors.empty()) {
    std::string message =
        errors.size() == 1 ? errors.front() : cat(errors.size(), " launch variable errors:");
    if (errors.size() > 1) {
      for (const std::string& e : errors) message += cat("\n  ", e);
    }
    return absl::InvalidArgumentError(to_absl(message));
  }
  info.rank = static_cast<int>(rank.value_or(0));
  info.world_size = static_cast<int>(world.value_or(1));
  info.local_rank = static_cast<int>(local_rank.value_or(info.rank));
  if (local_world) info.local_world_size = static_cast<int>(*local_world);
  if (group_rank) info.node_rank = static_cast<int>(*group_rank);
  // A job of one rank that names no port serves its rendezvous on a free one: nothing else
  // joins it, and two lone trainers on one machine must not collide on the default port.
  info.master_port =
      info.world_size == 1 && !port ? 0 : static_cast<uint16_t>(port.value_or(29500));
  info.launched = rank.has_value() || world.has_value();
  info.agent_store = agent_store.value_or(false);
  info.restart_count = static_cast<int>(restarts.value_or(0));
  if (const auto it = vars.find("TORCHELASTIC_RUN_ID"); it != vars.end()) {
    info.run_id = std::string(trim(it->second));
  }
  if (info.agent_store || !info.run_id.empty()) {
    info.source = "torchrun";
  } else if (slurm) {
    info.source = slurm->description;
  } else if (info.launched) {
    info.source = "RANK and WORLD_SIZE";
  }
  return info;
}

absl::StatusOr<LaunchInfo> LaunchInfo::from_environment() {
  std::map<std::string, std::string> vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const size_t equals = text.find('=');
    if (equals == std::string_view::npos) continue;
    const std::string_view name = text.substr(0, equals);
    if (is_launch_variable(name)) vars.emplace(name, text.substr(equals + 1));
  }
  return from_variables(vars);
}

}  // namespace strata
