// strata-run: starts N local ranks of a program with the variables torchrun sets (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), forwards signals, and stops
// them all when one fails — the torchrun --standalone of strata (docs/strata-run.md).
//
// Exit codes: 0 every rank exited 0; the first failing rank's exit status, or 128 + the signal
// that killed it; 128 + signal when strata-run was signalled; 1 when a rank could not be started;
// 2 bad command line.
//
// Its own parser, not cli::FlagSet: flags end at PROGRAM, and everything after it is PROGRAM's.
#include <absl/strings/numbers.h>
#include <absl/strings/str_format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "run/launcher.h"
#include "run/node_rendezvous.h"
#include "strata/base/system.h"
#include "strata/base/unique_fd.h"

namespace strata {
namespace {

constexpr const char* kProgram = "strata-run";
constexpr double kMaxGraceSeconds = 86400;

constexpr const char* kUsage =
    R"(usage: strata-run -n N [flags] PROGRAM [ARGS...]

Starts N local ranks of PROGRAM, each with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (the rest of the environment
inherited). With --nnodes, one strata-run per machine: they meet at --master-addr:--port, check
that every node starts the same N, and number the ranks RANK = node rank x N + local rank. When a rank fails, the
others get SIGTERM, then SIGKILL after the grace, and strata-run exits with the failing rank's
status. SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every rank.

flags (before PROGRAM; everything after PROGRAM is passed to it, and -- may end the flags):
  -n N, --nproc=N, --nproc-per-node=N
      number of local ranks, 1 to 1024 (required)
  --nnodes=NODES
      number of machines of the job, each running one strata-run (default: 1)
  --node-rank=K
      this machine's node, 0 to NODES-1; node 0 is the machine of --master-addr (required with
      --nnodes above 1)
  --master-addr=ADDR
      MASTER_ADDR for the ranks (default: 127.0.0.1); with --nnodes, an address of node 0 that
      every node reaches
  --port=PORT, --master-port=PORT
      MASTER_PORT for the ranks, 1 to 65535 (default: a free port of MASTER_ADDR); with --nnodes,
      the port of the nodes' rendezvous on node 0 (default: 29500), and node 0 picks the ranks'
      MASTER_PORT
  (torchrun's spellings with _ instead of - are accepted too)
  --grace=SECONDS
      how long stopped ranks get between SIGTERM and SIGKILL (default: 10; fractions allowed)
  --tag-output
      prefix every line the ranks write with "[rank N] "
  --help, -h
      print this help and exit

exit status: 0 when every rank exits 0; the first failing rank's exit status, or 128 + the
signal that killed it; 128 + signal when strata-run is signalled; 1 when the nodes could not
agree (STRATA_COMM_TIMEOUT bounds the wait); 2 for a bad command line.
See docs/strata-run.md.
)";

struct Parsed {
  std::optional<std::string> nproc;
  std::string nproc_flag = "-n";  // as the user wrote it: -n or --nproc
  std::string master_addr = "127.0.0.1";
  std::optional<std::string> port;
  std::optional<std::string> grace;
  std::optional<std::string> nnodes;
  std::optional<std::string> node_rank;
  bool tag_output = false;
  bool help = false;
  std::vector<std::string> program_and_args;
};

struct UsageError {
  std::string message;
};

// Flags up to PROGRAM; an error names the flag and the fix.
std::optional<UsageError> parse_args(int argc, char** argv, Parsed& p) {
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM
    if (arg == "-h" || arg == "--help") {
      p.help = true;
      return std::nullopt;
    }
    if (arg == "--tag-output") {
      p.tag_output = true;
      continue;
    }
    // A flag with a value: -n N, -nN, --name=value, --name value.
    std::string name;
    std::optional<std::string> value;
    if (arg.substr(0, 2) == "-n" && arg != "-n" && arg[2] != '-') {
      name = "-n";
      value = std::string(arg.substr(arg[2] == '=' ? 3 : 2));
    } else {
      const size_t eq = arg.find('=');
      name = std::string(arg.substr(0, eq));
      if (eq != std::string_view::npos) value = std::string(arg.substr(eq + 1));
    }
    // torchrun's spellings: --nproc-per-node, --master-port, and _ for - in every long name.
    if (name.size() > 2 && name[1] == '-') std::replace(name.begin() + 2, name.end(), '_', '-');
    if (name == "--nproc-per-node") name = "--nproc";
    if (name == "--master-port") name = "--port";
    std::optional<std::string>* target = nullptr;
    std::optional<std::string> addr;
    if (name == "-n" || name == "--nproc") {
      target = &p.nproc;
      p.nproc_flag = name;
    } else if (name == "--port") {
      target = &p.port;
    } else if (name == "--grace") {
      target = &p.grace;
    } else if (name == "--nnodes") {
      target = &p.nnodes;
    } else if (name == "--node-rank") {
      target = &p.node_rank;
    } else if (name == "--master-addr") {
      target = &addr;
    } else {
      return UsageError{absl::StrFormat(
          "unknown flag %s: strata-run's flags are -n/--nproc, --nnodes, --node-rank, "
          "--master-addr, --port, --grace and --tag-output; a flag meant for PROGRAM goes after "
          "it (or after --)",
          name)};
    }
    if (!value) {
      if (i + 1 >= argc) {
        return UsageError{absl::StrFormat("flag %s needs a value: %s %s", name, name,
                                          name == "--master-addr" ? "ADDR"
                                          : name == "--port"      ? "PORT"
                                          : name == "--grace"     ? "SECONDS"
                                          : name == "--node-rank" ? "K"
                                                                  : "N")};
      }
      value = argv[++i];
    }
    *target = std::move(value);
    if (addr) {
      if (addr->empty()) {
        return UsageError{"--master-addr is empty: give an address, e.g. --master-addr 127.0.0.1"};
      }
      p.master_addr = *addr;
    }
  }
  for (; i < argc; ++i) p.program_and_args.emplace_back(argv[i]);
  return std::nullopt;
}

std::optional<UsageError> check_nproc(const std::optional<std::string>& text,
                                      const std::string& flag, int* out) {
  if (!text) {
    return UsageError{
        "missing -n N: give the number of ranks to start, e.g. strata-run -n 2 "
        "PROGRAM"};
  }
  uint64_t n = 0;
  const bool digits = !text->empty() && text->find_first_not_of("0123456789") == std::string::npos;
  if (!digits || !absl::SimpleAtoi(*text, &n) || n == 0) {
    return UsageError{
        absl::StrFormat("%s '%s' is not a number of ranks: give a whole number from 1 to %d", flag,
                        *text, run::kMaxRanks)};
  }
  if (n > static_cast<uint64_t>(run::kMaxRanks)) {
    return UsageError{absl::StrFormat(
        "%s %s is more than the %d local ranks strata-run starts: lower it (start ranks on "
        "several machines for more)",
        flag, *text, run::kMaxRanks)};
  }
  *out = static_cast<int>(n);
  return std::nullopt;
}

std::optional<UsageError> check_port(const std::string& text, int* out) {
  uint64_t port = 0;
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits || !absl::SimpleAtoi(text, &port) || port == 0 || port > 65535) {
    return UsageError{absl::StrFormat(
        "--port '%s' is out of range: give a TCP port from 1 to 65535, or leave --port out for a "
        "free one",
        text)};
  }
  *out = static_cast<int>(port);
  return std::nullopt;
}

std::optional<UsageError> check_grace(const std::string& text, double* out) {
  double seconds = 0;
  if (!absl::SimpleAtod(text, &seconds) || !std::isfinite(seconds)) {
    return UsageError{absl::StrFormat(
        "--grace '%s' is not a number of seconds: give e.g. --grace 10 or --grace 0.5", text)};
  }
  if (seconds < 0 || seconds > kMaxGraceSeconds) {
    return UsageError{absl::StrFormat(
        "--grace %s is out of range: give a number of seconds from 0 to %g (0 sends SIGKILL at "
        "once)",
        text, kMaxGraceSeconds)};
  }
  *out = seconds;
  return std::nullopt;
}

constexpr int kMaxNodes = 4096;
constexpr int kDefaultNodesPort = 29500;  // torchrun's --master-port default

// --nnodes and --node-rank: a whole number each, the node rank below the node count.
std::optional<UsageError> check_nodes(const Parsed& p, int nproc, int* nnodes, int* node_rank) {
  const auto whole = [](const std::string& t, uint64_t* v) {
    return !t.empty() && t.find_first_not_of("0123456789") == std::string::npos &&
           absl::SimpleAtoi(t, v);
  };
  uint64_t n = 1;
  if (p.nnodes && (!whole(*p.nnodes, &n) || n == 0 || n > kMaxNodes)) {
    return UsageError{
        absl::StrFormat("--nnodes '%s' is not a number of nodes: give a whole number from 1 to %d",
                        *p.nnodes, kMaxNodes)};
  }
  uint64_t k = 0;
  if (p.node_rank && (!whole(*p.node_rank, &k) || k >= n)) {
    return UsageError{absl::StrFormat(
        "--node-rank '%s' is not a node of --nnodes=%d: give a whole number from 0 to %d (each "
        "node's launcher gets its own)",
        *p.node_rank, n, n - 1)};
  }
  if (n > 1 && !p.node_rank) {
    return UsageError{absl::StrFormat(
        "--nnodes=%d needs --node-rank=K on every node: 0 on the machine of --master-addr, 1 to "
        "%d on the others",
        n, n - 1)};
  }
  if (n * static_cast<uint64_t>(nproc) > (uint64_t{1} << 20)) {
    return UsageError{
        absl::StrFormat("--nnodes=%d x -n %d is more than the %d ranks a job may have: lower one",
                        n, nproc, 1 << 20)};
  }
  *nnodes = static_cast<int>(n);
  *node_rank = static_cast<int>(k);
  return std::nullopt;
}

bool is_executable_file(const std::string& path, bool* exists) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  *exists = true;
  return S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// PROGRAM as execvp finds it: a name with a slash as it is, else the first executable file of
// that name in $PATH.
std::optional<UsageError> resolve_program(const std::string& name, std::string* path) {
  if (name.empty()) return UsageError{"PROGRAM '' is empty: name the program to start"};
  bool exists = false;
  if (name.find('/') != std::string::npos) {
    if (is_executable_file(name, &exists)) {
      *path = name;
      return std::nullopt;
    }
    if (!exists) {
      return UsageError{absl::StrFormat("PROGRAM '%s' does not exist: check the path", name)};
    }
    return UsageError{absl::StrFormat(
        "PROGRAM '%s' is not an executable file: name a program (chmod +x it if it is a script)",
        name)};
  }
  std::string search;
  if (const char* env = std::getenv("PATH"); env != nullptr) {
    search = env;
  } else {
    search = "/bin:/usr/bin";
  }
  std::string not_executable;
  size_t start = 0;
  while (true) {
    const size_t colon = search.find(':', start);
    std::string dir = search.substr(start, colon == std::string::npos ? colon : colon - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    bool found = false;
    if (is_executable_file(candidate, &found)) {
      *path = candidate;
      return std::nullopt;
    }
    if (found && not_executable.empty()) not_executable = candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (!not_executable.empty()) {
    return UsageError{absl::StrFormat(
        "PROGRAM '%s' is not executable (found %s): chmod +x it, or name another program", name,
        not_executable)};
  }
  return UsageError{absl::StrFormat(
      "PROGRAM '%s' was not found in PATH: give its path (e.g. ./%s) or add its folder to PATH",
      name, name)};
}

// A port nobody listens on: bind port 0 on the address, read what the kernel chose, close.
std::optional<UsageError> free_port(const std::string& addr, int* port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(addr.c_str(), "0", &hints, &found); rc != 0) {
    return UsageError{absl::StrFormat(
        "--master-addr '%s' cannot be resolved (%s): give an address of this machine, e.g. "
        "127.0.0.1",
        addr, gai_strerror(rc))};
  }
  std::string error;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd || ::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      error = sys::errno_text(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      error = sys::errno_text(errno);
      continue;
    }
    *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(found);
    return std::nullopt;
  }
  freeaddrinfo(found);
  return UsageError{absl::StrFormat(
      "--master-addr '%s' is not an address of this machine (bind: %s): give a local address, "
      "or choose the port with --port",
      addr, error)};
}

int usage_error(const UsageError& e) {
  std::cerr << cli::error_line(kProgram, e.message) << "Run 'strata-run --help' for usage.\n"
            << std::flush;
  return cli::kUsageExitCode;
}

int run_main(int argc, char** argv) {
  Parsed p;
  if (auto e = parse_args(argc, argv, p)) return usage_error(*e);
  if (p.help) {
    std::cout << kUsage;
    return 0;
  }
  run::LaunchOptions o;
  o.master_addr = p.master_addr;
  o.tag_output = p.tag_output;
  if (auto e = check_nproc(p.nproc, p.nproc_flag, &o.nproc)) return usage_error(*e);
  if (p.grace) {
    if (auto e = check_grace(*p.grace, &o.grace_seconds)) return usage_error(*e);
  }
  if (p.port) {
    if (auto e = check_port(*p.port, &o.master_port)) return usage_error(*e);
  }
  if (p.program_and_args.empty()) {
    return usage_error(
        {"missing PROGRAM: give the program each rank runs, e.g. strata-run -n 2 "
         "./train --steps=10"});
  }
  if (auto e = resolve_program(p.program_and_args[0], &o.program_path)) return usage_error(*e);
  if (auto e = check_nodes(p, o.nproc, &o.nnodes, &o.node_rank)) return usage_error(*e);
  if (o.nnodes == 1 && !p.port) {
    if (auto e = free_port(o.master_addr, &o.master_port)) return usage_error(*e);
  }
  o.argv = std::move(p.program_and_args);
  run::NodeAgreement agreement;  // node 0 serves the nodes' rendezvous until the job ends
  if (o.nnodes > 1) {
    absl::StatusOr<std::chrono::milliseconds> timeout = run::rendezvous_timeout();
    if (!timeout.ok()) return usage_error({std::string(timeout.status().message())});
    absl::StatusOr<run::NodeAgreement> agreed =
        run::agree_with_nodes({.nnodes = o.nnodes,
                               .node_rank = o.node_rank,
                               .nproc = o.nproc,
                               .master_addr = o.master_addr,
                               .port = p.port ? o.master_port : kDefaultNodesPort,
                               .timeout = *timeout});
    if (!agreed.ok()) {
      std::cerr << "strata-run: " << agreed.status().message() << "\n" << std::flush;
      return 1;
    }
    agreement = *std::move(agreed);
    o.master_port = agreement.ranks_port;
  }
  std::fflush(stdout);
  return run::launch(o);
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::run_main(argc, argv); }
