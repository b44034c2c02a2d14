#include "strata/config/slurm.h"

#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>

#include <cstdint>

#include "strata/base/text.h"

namespace strata {
namespace {

using namespace text;  // NOLINT(build/namespaces): string_view helpers

constexpr std::string_view kNames[] = {
    "SLURM_STEP_ID",         "SLURM_PROCID",         "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",  "SLURM_LOCALID",        "SLURM_NODEID",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST"};

// The steps whose processes srun did not start as tasks of a job: the batch script, the
// extern step (pam_slurm_adopt) and the interactive step (salloc's shell), by name or by the
// ids Slurm gives them (SLURM_BATCH_SCRIPT 0xfffffffb, SLURM_EXTERN_CONT 0xfffffffc,
// SLURM_INTERACTIVE_STEP 0xfffffffa).
bool is_task_step(std::string_view step) {
  uint64_t id = 0;
  if (!absl::SimpleAtoi(to_absl(trim(step)), &id)) return false;  // "batch", "extern", ...
  return id < 0xfffffffaull;
}

const std::string* find(const std::map<std::string, std::string>& vars, std::string_view name) {
  const auto it = vars.find(std::string(name));
  return it == vars.end() ? nullptr : &it->second;
}

// An integer in [min, max] from `name`, or an error naming it.
absl::StatusOr<int> integer(std::string_view name, const std::string& value, int64_t min,
                            int64_t max, std::string_view form) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(to_absl(trim(value)), &v) || v < min || v > max) {
    return absl::InvalidArgumentError(
        to_absl(cat(name, "='", value, "' is not ", form, " (srun sets it; check the srun line)")));
  }
  return static_cast<int>(v);
}

}  // namespace

bool is_slurm_task_variable(std::string_view name) {
  for (std::string_view n : kNames) {
    if (n == name) return true;
  }
  return false;
}

bool has_torch_launch_variable(const std::map<std::string, std::string>& vars) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    if (vars.count(name) != 0) return true;
  }
  return false;
}

absl::StatusOr<std::vector<int>> parse_slurm_tasks_per_node(std::string_view text) {
  std::vector<int> counts;
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        to_absl(cat("'", text,
                    "' is not a tasks-per-node list: srun writes counts per node, "
                    "a repeated count as N(xK), e.g. 2(x3),1")));
  };
  if (trim(text).empty()) return bad();
  for (absl::string_view piece : absl::StrSplit(to_absl(trim(text)), ',')) {
    std::string_view item = trim(to_std(piece));
    int64_t count = 0;
    int64_t repeat = 1;
    const size_t open = item.find('(');
    if (open != std::string_view::npos) {
      if (!item.ends_with(")") || item.substr(open + 1, 1) != "x") return bad();
      const std::string_view times = item.substr(open + 2, item.size() - open - 3);
      if (!absl::SimpleAtoi(to_absl(times), &repeat) || repeat < 1 || repeat > (1 << 20)) {
        return bad();
      }
      item = item.substr(0, open);
    }
    if (!absl::SimpleAtoi(to_absl(item), &count) || count < 1 || count > (1 << 20)) return bad();
    if (counts.size() + static_cast<size_t>(repeat) > (size_t{1} << 20)) return bad();
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(count));
  }
  return counts;
}

absl::StatusOr<std::optional<SlurmTask>> slurm_task(
    const std::map<std::string, std::string>& vars) {
  const std::string* step = find(vars, "SLURM_STEP_ID");
  const std::string* procid = find(vars, "SLURM_PROCID");
  if (step == nullptr || procid == nullptr || !is_task_step(*step)) return std::nullopt;
  const std::string* ntasks = find(vars, "SLURM_STEP_NUM_TASKS");
  std::string_view ntasks_name = "SLURM_STEP_NUM_TASKS";
  if (ntasks == nullptr) {
    ntasks = find(vars, "SLURM_NTASKS");
    ntasks_name = "SLURM_NTASKS";
  }
  if (ntasks == nullptr) {
    return absl::InvalidArgumentError(
        "srun started this task (SLURM_STEP_ID and SLURM_PROCID are set) but neither "
        "SLURM_NTASKS nor SLURM_STEP_NUM_TASKS is: set WORLD_SIZE and RANK yourself, or start "
        "the ranks with srun -n N");
  }
  constexpr int64_t kMax = 1 << 20;
  absl::StatusOr<int> world = integer(ntasks_name, *ntasks, 1, kMax, "a task count");
  if (!world.ok()) return world.status();
  absl::StatusOr<int> rank = integer("SLURM_PROCID", *procid, 0, *world - 1,
                                     cat("a task rank below ", ntasks_name, "=", *world));
  if (!rank.ok()) return rank.status();
  SlurmTask task;
  task.world_size = *world;
  task.rank = *rank;
  task.local_rank = task.rank;
  task.description =
      cat("srun task SLURM_PROCID=", task.rank, " of ", ntasks_name, "=", task.world_size);
  if (const std::string* local = find(vars, "SLURM_LOCALID")) {
    absl::StatusOr<int> v = integer("SLURM_LOCALID", *local, 0, kMax - 1, "a local task rank");
    if (!v.ok()) return v.status();
    task.local_rank = *v;
  }
  task.node.reset();
  if (const std::string* node = find(vars, "SLURM_NODEID")) {
    absl::StatusOr<int> v = integer("SLURM_NODEID", *node, 0, kMax - 1, "a node index");
    if (!v.ok()) return v.status();
    task.node = *v;
  }
  if (const std::string* per_node = find(vars, "SLURM_NTASKS_PER_NODE")) {
    absl::StatusOr<int> v =
        integer("SLURM_NTASKS_PER_NODE", *per_node, 1, kMax, "a task count per node");
    if (!v.ok()) return v.status();
    task.local_world_size = *v;
  } else {
    std::string_view name = "SLURM_STEP_TASKS_PER_NODE";
    const std::string* list = find(vars, name);
    if (list == nullptr) {
      name = "SLURM_TASKS_PER_NODE";
      list = find(vars, name);
    }
    if (list != nullptr) {
      absl::StatusOr<std::vector<int>> counts = parse_slurm_tasks_per_node(*list);
      if (!counts.ok()) {
        return absl::InvalidArgumentError(to_absl(cat(name, "=", counts.status().message())));
      }
      const int node = task.node.value_or(0);
      if (node >= static_cast<int>(counts->size())) {
        return absl::InvalidArgumentError(to_absl(cat(name, "='", *list, "' lists ", counts->size(),
                                                      " node(s) but SLURM_NODEID=", node,
                                                      ": srun sets both; check the srun "
                                                      "line")));
      }
      task.local_world_size = (*counts)[static_cast<size_t>(node)];
    }
  }
  if (task.local_world_size && task.local_rank >= *task.local_world_size) {
    return absl::InvalidArgumentError(to_absl(
        cat("SLURM_LOCALID=", task.local_rank, " is not below this node's ", *task.local_world_size,
            " task(s) per node: srun sets both; check the srun "
            "line")));
  }
  return task;
}

}  // namespace strata
