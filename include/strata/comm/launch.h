// Launch variables: the ones torchrun, Slurm wrappers and Kubernetes operators already set.
//
//   RANK         this process's rank, 0 .. WORLD_SIZE-1
//   WORLD_SIZE   number of ranks in the job
//   LOCAL_RANK   rank on this machine (picks the GPU); defaults to RANK when WORLD_SIZE ranks
//                are all local, and must be given otherwise only if a GPU is used
//   MASTER_ADDR  host of rank 0, which serves the rendezvous (default 127.0.0.1 when unset)
//   MASTER_PORT  its TCP port (default 29500; a job of one rank without it: a free port)
//
// A process with none of them set is a job of one rank (rank 0 of 1), so a trainer runs the same
// way alone and under strata-run.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <map>
#include <string>

namespace strata {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;  // 0: any free port (a job of one rank only)
  // True when RANK or WORLD_SIZE was set (a launcher started this process).
  bool launched = false;

  static absl::StatusOr<LaunchInfo> from_environment();
  // Same, from a name → value map (names other than the five above are ignored). Errors name
  // the variable, its value and the accepted form; every bad variable is reported.
  static absl::StatusOr<LaunchInfo> from_variables(const std::map<std::string, std::string>& vars);
};

}  // namespace strata
