// strata-run's launcher: starts the local ranks of a job, watches them, stops them all when one
// fails or when strata-run is signalled, and says in one line what happened (docs/strata-run.md).
//
// It only starts processes: it knows nothing of communicators, only the variables a rank reads
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT). Ranks are named by their job-wide RANK in every message and tag.
#pragma once

#include <string>
#include <vector>

namespace strata::run {

struct LaunchOptions {
  int nproc = 0;                  // local ranks, 1..kMaxRanks
  int nnodes = 1;                 // nodes of the job, each starting nproc ranks
  int node_rank = 0;              // this node: its ranks are node_rank * nproc + 0..nproc-1
  std::string master_addr;        // MASTER_ADDR as the ranks see it
  int master_port = 0;            // MASTER_PORT, 1..65535
  double grace_seconds = 10;      // SIGTERM -> SIGKILL delay when stopping the ranks
  bool tag_output = false;        // prefix every line of the ranks' output with "[rank N] "
  std::string program_path;       // PROGRAM resolved as execvp would (an executable file)
  std::vector<std::string> argv;  // argv[0] is PROGRAM as the user wrote it
};

inline constexpr int kMaxRanks = 1024;

// Runs the job to its end and returns strata-run's exit status: 0 when every rank exited 0; the
// first failing rank's exit status (128 + signal when it died of one); 128 + signal when
// strata-run was signalled first. Writes one line to stderr unless every rank succeeded.
int launch(const LaunchOptions& options);

// "0, 1, 3" or "0-5, 7" (runs of three or more are written as a range).
std::string rank_list(const std::vector<int>& ranks);

// "exited with status 3" or "was killed by signal 9 (SIGKILL)", from a siginfo_t's si_code and
// si_status (CLD_EXITED / CLD_KILLED / CLD_DUMPED).
std::string status_text(int code, int status);

// "SIGTERM" for 15; "signal 64" where the C library has no name.
std::string signal_name(int sig);

}  // namespace strata::run
