// Launch variables: the ones torchrun, Slurm wrappers and Kubernetes operators already set.
//
//   RANK         this process's rank, 0 .. WORLD_SIZE-1
//   WORLD_SIZE   number of ranks in the job
//   LOCAL_RANK   rank on this machine (picks the GPU); defaults to RANK when WORLD_SIZE ranks
//                are all local, and must be given otherwise only if a GPU is used
//   LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE
//                ranks on this machine, this machine's index and count, the rank within its
//                role (torchrun sets them all; checked for consistency where set)
//   MASTER_ADDR  host of rank 0, which serves the rendezvous (default 127.0.0.1 when unset)
//   MASTER_PORT  its TCP port (default 29500; a job of one rank without it: a free port)
//
// torchrun (torch.distributed.elastic) adds TORCHELASTIC_USE_AGENT_STORE=True: its agent itself
// serves a torch TCPStore on MASTER_ADDR:MASTER_PORT for the job's life, so rank 0 must not bind
// that port. strata then joins through the agent's store (CommOptions::rendezvous_store): rank 0
// serves strata's rendezvous on a free port and announces it there, under a key of this attempt
// (TORCHELASTIC_RESTART_COUNT), so that a restarted job never reads an earlier attempt's address.
//
// Under srun without torch's variables, SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the tasks
// per node stand in (strata/config/slurm.h); MASTER_ADDR and MASTER_PORT are then required for
// a job of several tasks.
//
// A process with none of them set is a job of one rank (rank 0 of 1), so a trainer runs the same
// way alone and under strata-run.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::optional<int> local_world_size;  // LOCAL_WORLD_SIZE (srun: tasks on this node)
  std::optional<int> node_rank;         // GROUP_RANK (srun: SLURM_NODEID)
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;  // 0: any free port (a job of one rank only)
  // True when RANK or WORLD_SIZE was set, or srun's variables stood in for them.
  bool launched = false;
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves MASTER_ADDR:MASTER_PORT.
  bool agent_store = false;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: the attempt (torchrun --max-restarts)
  std::string run_id;     // TORCHELASTIC_RUN_ID ("" when unset)
  // Who described this launch, for messages: "torchrun", "srun task SLURM_PROCID=1 of
  // SLURM_NTASKS=2", "RANK and WORLD_SIZE", or "" (a lone process).
  std::string source;

  static absl::StatusOr<LaunchInfo> from_environment();
  // Same, from a name → value map (other names are ignored). Errors name the variable, its
  // value and the accepted form; every bad variable is reported.
  static absl::StatusOr<LaunchInfo> from_variables(const std::map<std::string, std::string>& vars);
};

// Whether `name` is a variable from_variables() reads (callers that copy an environment keep
// these).
bool is_launch_variable(std::string_view name);

// Whether `name` is one of the variables torch's launchers set to describe a launch: those
// from_variables() reads but srun's, and torchrun's ROLE_NAME and TORCHELASTIC_MAX_RESTARTS
// (a launcher that replaces the launch, as strata-run under torchrun, drops them all).
bool is_torch_launch_variable(std::string_view name);

}  // namespace strata
