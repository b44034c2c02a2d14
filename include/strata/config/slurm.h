// Slurm's srun starts one task per rank and describes it with SLURM_* variables, not torch's
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK). Where torch's are absent, srun's
// stand in for them: the configuration reads the local ones (the device, the node's memory
// shares), comm/launch.h the rest.
//
//   RANK             SLURM_PROCID
//   WORLD_SIZE       SLURM_NTASKS (SLURM_STEP_NUM_TASKS where set: the step's, not the job's)
//   LOCAL_RANK       SLURM_LOCALID
//   LOCAL_WORLD_SIZE SLURM_NTASKS_PER_NODE, else this node's entry (SLURM_NODEID) of
//                    SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE ("2(x3),1")
//   GROUP_RANK       SLURM_NODEID
//
// Only a task that srun started counts (SLURM_STEP_ID set and not "batch"/"extern"): the batch
// script itself also sees SLURM_PROCID=0 and the job's SLURM_NTASKS, and a trainer started there
// without srun is one process, not rank 0 of a job whose other ranks never come.
#pragma once

#include <absl/status/statusor.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

struct SlurmTask {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::optional<int> local_world_size;  // unknown when srun gave no tasks-per-node
  std::optional<int> node = 0;          // SLURM_NODEID
  // "srun task SLURM_PROCID=3 of SLURM_NTASKS=8", for messages.
  std::string description;
};

// Whether `name` is one of the SLURM_* variables read here (callers that copy variables from an
// environment keep these).
bool is_slurm_task_variable(std::string_view name);

// Whether any of torch's launch variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) is
// set: then they describe the launch (torchrun inside an srun step, a wrapper that maps
// SLURM_* itself) and srun's variables stand in for none of them.
bool has_torch_launch_variable(const std::map<std::string, std::string>& vars);

// The task srun started this process as, from a name -> value map; nullopt when srun did not
// start it (no SLURM_STEP_ID, or the batch or extern step). A malformed value is an error
// naming the variable, its value and the accepted form.
absl::StatusOr<std::optional<SlurmTask>> slurm_task(const std::map<std::string, std::string>& vars);

// SLURM_TASKS_PER_NODE's syntax: counts per node, "2(x3),1" = 2, 2, 2, 1.
absl::StatusOr<std::vector<int>> parse_slurm_tasks_per_node(std::string_view text);

// What a job of several srun tasks needs and Slurm does not set, as the error says it:
// MASTER_ADDR and MASTER_PORT, exported before srun from the job's first node.
inline constexpr std::string_view kSlurmMasterHint =
    "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) "
    "MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)) before srun (in the sbatch script), so that "
    "every task meets rank 0 on the job's first node";

}  // namespace strata
