// Starts the ranks of a job as child processes of a test, each with its launch variables and its
// output captured, and guarantees none outlives the test: wait() is bounded and the destructor
// kills and reaps whatever is left. The children also die with the test (PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata::testing {

// A TCP port that was free on 127.0.0.1 a moment ago.
uint16_t free_port();

struct RankOutcome {
  int rank = 0;
  bool exited = false;          // else killed by a signal
  int status = 0;               // exit status, or the signal number
  bool killed_by_test = false;  // still running at the bound
  std::string output;           // stdout and stderr
};

class RankProcesses {
 public:
  // Ranks `ranks` of a job of `world_size` ranks on 127.0.0.1:`port`, each running
  // `argv` with `env` added to the environment.
  RankProcesses(const std::vector<std::string>& argv, int world_size, const std::vector<int>& ranks,
                uint16_t port, const std::map<std::string, std::string>& env);
  ~RankProcesses();
  RankProcesses(const RankProcesses&) = delete;
  RankProcesses& operator=(const RankProcesses&) = delete;

  // Waits until every rank has ended or `bound` has passed (then kills the rest). A rank in
  // `stuck` (one expected never to end by itself) is killed as soon as every other has ended.
  std::vector<RankOutcome> wait(std::chrono::milliseconds bound, std::vector<int> stuck = {});

 private:
  struct Child {
    int rank;
    pid_t pid;
    std::string output_path;
  };
  std::vector<Child> children_;
  std::string dir_;
};

}  // namespace strata::testing
