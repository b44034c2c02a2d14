#include "rank_processes.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace strata::testing {

uint16_t free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    std::abort();
  }
  close(fd);
  return ntohs(addr.sin_port);
}

RankProcesses::RankProcesses(const std::vector<std::string>& argv, int world_size,
                             const std::vector<int>& ranks, uint16_t port,
                             const std::map<std::string, std::string>& env) {
  char pattern[] = "/tmp/strata-ranks-XXXXXX";
  dir_ = mkdtemp(pattern);
  const pid_t parent = getpid();
  for (int rank : ranks) {
    const std::string output = dir_ + "/rank" + std::to_string(rank) + ".out";
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      const int fd = open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    children_.push_back({rank, pid, output});
  }
}

std::vector<RankOutcome> RankProcesses::wait(std::chrono::milliseconds bound,
                                             std::vector<int> stuck) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const auto is_stuck = [&](const Child& c) {
    return std::find(stuck.begin(), stuck.end(), c.rank) != stuck.end();
  };
  std::vector<RankOutcome> outcomes(children_.size());
  std::vector<bool> ended(children_.size(), false);
  size_t others_running = 0;
  for (const Child& c : children_) others_running += is_stuck(c) ? 0 : 1;
  while (std::find(ended.begin(), ended.end(), false) != ended.end()) {
    const bool past_bound = std::chrono::steady_clock::now() >= deadline;
    for (size_t i = 0; i < children_.size(); ++i) {
      if (ended[i]) continue;
      Child& child = children_[i];
      RankOutcome& outcome = outcomes[i];
      outcome.rank = child.rank;
      int status = 0;
      pid_t done = waitpid(child.pid, &status, WNOHANG);
      if (done != child.pid && (past_bound || (is_stuck(child) && others_running == 0))) {
        kill(child.pid, SIGKILL);
        waitpid(child.pid, &status, 0);
        outcome.killed_by_test = true;
        done = child.pid;
      }
      if (done != child.pid) continue;
      ended[i] = true;
      if (!is_stuck(child)) --others_running;
      child.pid = -1;
      outcome.exited = WIFEXITED(status);
      outcome.status = outcome.exited ? WEXITSTATUS(status) : WTERMSIG(status);
      std::ifstream in(child.output_path);
      std::stringstream text;
      text << in.rdbuf();
      outcome.output = text.str();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return outcomes;
}

RankProcesses::~RankProcesses() {
  for (Child& child : children_) {
    if (child.pid <= 0) continue;
    kill(child.pid, SIGKILL);
    waitpid(child.pid, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace strata::testing
