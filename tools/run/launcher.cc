// strata-run's launcher (launcher.h). One thread, one poll loop: signal handlers only set a flag
// and write a byte to a pipe (the self-pipe trick); everything else happens in the loop.
//
// Ranks stay unreaped (zombies) until the job is over, so that a rank's pid, which is also its
// process group id, cannot be reused while strata-run may still signal that group.
#include "run/launcher.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "run/tagged_output.h"
#include "strata/base/system.h"
#include "strata/base/unique_fd.h"
#include "strata/comm/launch.h"

extern char** environ;

namespace strata::run {
namespace {

using Clock = std::chrono::steady_clock;

// The signals strata-run passes on to every rank.
constexpr std::array<int, 4> kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

std::atomic<int> g_wake_fd{-1};
std::array<std::atomic<bool>, NSIG> g_pending{};

static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "signal handlers may only touch lock-free atomics");

extern "C" void on_signal(int sig) {
  const int saved_errno = errno;
  if (sig > 0 && sig < NSIG) g_pending[static_cast<size_t>(sig)].store(true);
  const unsigned char byte = static_cast<unsigned char>(sig);
  const int fd = g_wake_fd.load();
  if (fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);  // full pipe: the flag suffices
  }
  errno = saved_errno;
}

bool take_pending(int sig) { return g_pending[static_cast<size_t>(sig)].exchange(false); }

// Installs the handlers and restores the previous dispositions on destruction; children get the
// previous dispositions back before exec (restore_in_child), so a signal that was ignored when
// strata-run started (nohup) stays ignored in the ranks, and is not forwarded.
class SignalSetup {
 public:
  explicit SignalSetup(int wake_fd, bool ignore_sigpipe) {
    g_wake_fd.store(wake_fd);
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (const int sig : kForwarded) {
      Saved& s = saved_.emplace_back(Saved{sig, {}});
      sigaction(sig, nullptr, &s.old);
      if (s.old.sa_handler == SIG_IGN) {
        saved_.pop_back();
        continue;
      }
      sigaction(sig, &action, nullptr);
      forwarded_.push_back(sig);
    }
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    Saved& chld = saved_.emplace_back(Saved{SIGCHLD, {}});
    sigaction(SIGCHLD, &action, &chld.old);
    if (ignore_sigpipe) {
      // A closed stdout must not kill strata-run while it copies the ranks' output.
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      Saved& pipe = saved_.emplace_back(Saved{SIGPIPE, {}});
      sigaction(SIGPIPE, &ignore, &pipe.old);
    }
    sigemptyset(&blocked_);
    for (const Saved& s : saved_) sigaddset(&blocked_, s.sig);
  }
  ~SignalSetup() {
    for (const Saved& s : saved_) sigaction(s.sig, &s.old, nullptr);
    g_wake_fd.store(-1);
  }
  SignalSetup(const SignalSetup&) = delete;
  SignalSetup& operator=(const SignalSetup&) = delete;

  // Async-signal-safe: for the child between fork and exec.
  void restore_in_child() const {
    for (const Saved& s : saved_) sigaction(s.sig, &s.old, nullptr);
  }
  const sigset_t& handled() const { return blocked_; }
  const std::vector<int>& forwarded() const { return forwarded_; }

 private:
  struct Saved {
    int sig;
    struct sigaction old;
  };
  std::vector<Saved> saved_;
  std::vector<int> forwarded_;
  sigset_t blocked_{};
};

struct Rank {
  pid_t pid = -1;
  bool exited = false;
  int code = 0;
  int status = 0;
  bool stopped = false;  // still running when strata-run began to stop the job
  bool killed = false;   // still running when the grace ran out (got SIGKILL)
  bool failed() const { return exited && !(code == CLD_EXITED && status == 0); }
};

// argv and envp of one rank, as execve wants them; built before fork.
struct ExecArgs {
  std::vector<std::string> env_storage;
  std::vector<char*> envp;
  std::vector<char*> argv;
  std::vector<char*> sh_argv;  // for a script without #! line, as execvp does
};

// The variables of a launch that this one replaces: torch's, and torchrun's that describe a
// launch by its agent (a strata-run started under torchrun must not make its ranks look for
// torchrun's store). srun's SLURM_* stay: torch's variables, set below, take precedence.
bool replaced_by_this_launch(std::string_view entry) {
  return is_torch_launch_variable(entry.substr(0, entry.find('=')));
}

void build_exec_args(const LaunchOptions& o, int local_rank, std::vector<std::string>& argv_storage,
                     ExecArgs& out) {
  out.env_storage.clear();
  for (char** e = environ; *e != nullptr; ++e) {
    if (!replaced_by_this_launch(*e)) out.env_storage.emplace_back(*e);
  }
  out.env_storage.push_back(absl::StrFormat("RANK=%d", o.node_rank * o.nproc + local_rank));
  out.env_storage.push_back(absl::StrFormat("WORLD_SIZE=%d", o.nnodes * o.nproc));
  out.env_storage.push_back(absl::StrFormat("LOCAL_RANK=%d", local_rank));
  out.env_storage.push_back(absl::StrFormat("LOCAL_WORLD_SIZE=%d", o.nproc));
  out.env_storage.push_back(absl::StrFormat("GROUP_RANK=%d", o.node_rank));
  out.env_storage.push_back(absl::StrFormat("GROUP_WORLD_SIZE=%d", o.nnodes));
  out.env_storage.push_back("MASTER_ADDR=" + o.master_addr);
  out.env_storage.push_back(absl::StrFormat("MASTER_PORT=%d", o.master_port));
  out.envp.clear();
  for (std::string& s : out.env_storage) out.envp.push_back(s.data());
  out.envp.push_back(nullptr);
  if (out.argv.empty()) {
    for (std::string& s : argv_storage) out.argv.push_back(s.data());
    out.argv.push_back(nullptr);
    static char sh_name[] = "sh";
    out.sh_argv.push_back(sh_name);
    out.sh_argv.push_back(const_cast<char*>(o.program_path.c_str()));
    for (size_t i = 1; i < argv_storage.size(); ++i) out.sh_argv.push_back(argv_storage[i].data());
    out.sh_argv.push_back(nullptr);
  }
}

// What a child does between fork and exec; only async-signal-safe calls.
struct ChildSetup {
  pid_t parent = 0;
  const SignalSetup* signals = nullptr;
  const sigset_t* original_mask = nullptr;
  int stdout_fd = -1;  // tagged output: the write ends of the rank's pipes
  int stderr_fd = -1;
  int stdin_fd = -1;                      // /dev/null when strata-run's stdin is a terminal
  const struct rlimit* nofile = nullptr;  // the limit to give back when strata-run raised it
  const char* path = nullptr;
  const ExecArgs* args = nullptr;
  const std::string* exec_error = nullptr;
};

[[noreturn]] void run_child(const ChildSetup& c) {
  // Its own process group, so that the rank's own children can be signalled with it.
  setpgid(0, 0);
  // Never outlive strata-run; the parent may have died before prctl took effect.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != c.parent) _exit(127);
  c.signals->restore_in_child();
  if (c.stdout_fd >= 0) dup2(c.stdout_fd, STDOUT_FILENO);
  if (c.stderr_fd >= 0) dup2(c.stderr_fd, STDERR_FILENO);
  if (c.stdin_fd >= 0) dup2(c.stdin_fd, STDIN_FILENO);
  if (c.nofile != nullptr) setrlimit(RLIMIT_NOFILE, c.nofile);
  sigprocmask(SIG_SETMASK, c.original_mask, nullptr);
  execve(c.path, c.args->argv.data(), c.args->envp.data());
  if (errno == ENOEXEC) execve("/bin/sh", c.args->sh_argv.data(), c.args->envp.data());
  [[maybe_unused]] const ssize_t n =
      ::write(STDERR_FILENO, c.exec_error->data(), c.exec_error->size());
  _exit(127);
}

void signal_group(const Rank& r, int sig) {
  if (r.pid > 0) ::kill(-r.pid, sig);
}

std::string grace_text(double seconds) { return absl::StrFormat("%g s", seconds); }

class Job {
 public:
  explicit Job(const LaunchOptions& o) : o_(o), ranks_(static_cast<size_t>(o.nproc)) {}

  int run();

 private:
  bool start_ranks();
  void begin_stop(int sig);
  void forward(int sig);
  void check_exits();
  bool all_exited() const {
    // A rank that never started (pid -1) counts as gone.
    return std::all_of(ranks_.begin(), ranks_.end(),
                       [](const Rank& r) { return r.pid < 0 || r.exited; });
  }
  std::vector<int> ranks_where(bool Rank::*field) const {
    std::vector<int> out;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].*field) out.push_back(global(i));
    }
    return out;
  }
  // The job-wide RANK of local rank i.
  int global(size_t i) const { return o_.node_rank * o_.nproc + static_cast<int>(i); }
  std::string killed_note() const;
  int finish();
  // "strata-run: ", or "strata-run: node 1 of 2: " in a job of several nodes.
  std::string prefix() const {
    return o_.nnodes > 1 ? absl::StrFormat("strata-run: node %d of %d: ", o_.node_rank, o_.nnodes)
                         : std::string("strata-run: ");
  }

  const LaunchOptions& o_;
  std::vector<Rank> ranks_;
  std::optional<SignalSetup> signals_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  TaggedOutput output_;

  bool stopping_ = false;
  bool grace_over_ = false;
  Clock::time_point deadline_{};
  int first_failure_ = -1;   // the rank whose failure stopped the job
  int first_signal_ = 0;     // the signal that stopped the job, when that came first
  std::string start_error_;  // a rank could not be started
  std::vector<int> forwarded_to_;
};

bool Job::start_ranks() {
  sigset_t original_mask;
  sigprocmask(SIG_SETMASK, nullptr, &original_mask);

  UniqueFd devnull;
  if (isatty(STDIN_FILENO)) {
    // The ranks run in process groups of their own, in the background of the terminal: reading
    // it would stop them (SIGTTIN), so they read /dev/null instead.
    devnull = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  }
  std::optional<struct rlimit> nofile;
  if (o_.tag_output) {
    absl::StatusOr<std::optional<struct rlimit>> reserved = output_.reserve_fds(o_.nproc);
    if (!reserved.ok()) {
      start_error_ = absl::StrFormat("cannot start the ranks: %s", reserved.status().message());
      return false;
    }
    nofile = *reserved;
  }

  std::vector<std::string> argv_storage = o_.argv;
  const std::string exec_error =
      absl::StrFormat("strata-run: cannot execute '%s' (%s)\n", o_.argv[0], o_.program_path);
  ExecArgs args;
  const pid_t parent = getpid();
  for (int rank = 0; rank < o_.nproc; ++rank) {
    build_exec_args(o_, rank, argv_storage, args);
    TaggedOutput::ChildEnds ends;
    if (o_.tag_output) {
      absl::StatusOr<TaggedOutput::ChildEnds> made =
          output_.add_rank(global(static_cast<size_t>(rank)));
      if (!made.ok()) {
        start_error_ =
            absl::StrFormat("cannot start rank %d of %d: %s", global(static_cast<size_t>(rank)),
                            o_.nnodes * o_.nproc, made.status().message());
        return false;
      }
      ends = std::move(*made);
    }
    ChildSetup setup{parent,
                     &*signals_,
                     &original_mask,
                     ends.out.get(),
                     ends.err.get(),
                     devnull.get(),
                     nofile ? &*nofile : nullptr,
                     o_.program_path.c_str(),
                     &args,
                     &exec_error};
    // Blocked around fork: no handler of strata-run's may run in the child.
    sigprocmask(SIG_BLOCK, &signals_->handled(), nullptr);
    const pid_t pid = fork();
    if (pid == 0) run_child(setup);
    const int fork_errno = errno;
    if (pid > 0) {
      setpgid(pid, pid);  // also here, so that the group exists before anyone signals it
      ranks_[static_cast<size_t>(rank)].pid = pid;
    }
    sigprocmask(SIG_SETMASK, &original_mask, nullptr);
    if (pid < 0) {
      start_error_ = absl::StrFormat("cannot start rank %d of %d: fork failed: %s",
                                     global(static_cast<size_t>(rank)), o_.nnodes * o_.nproc,
                                     sys::errno_text(fork_errno));
      return false;
    }
  }
  return true;
}

// Stops the job: `sig` to the process group of every rank still running; SIGKILL after the grace.
void Job::begin_stop(int sig) {
  if (stopping_) return;
  stopping_ = true;
  deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(o_.grace_seconds));
  for (Rank& r : ranks_) {
    if (r.pid < 0 || r.exited) continue;
    r.stopped = true;
    signal_group(r, sig);
  }
}

void Job::forward(int sig) {
  if (!stopping_) {
    first_signal_ = sig;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (ranks_[i].pid > 0 && !ranks_[i].exited) forwarded_to_.push_back(global(i));
    }
    begin_stop(sig);
    return;
  }
  for (const Rank& r : ranks_) {
    if (!r.exited) signal_group(r, sig);
  }
}

void Job::check_exits() {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (r.pid < 0 || r.exited) continue;
    siginfo_t info{};
    // WNOWAIT: seen but not reaped, so the pid (and group id) stays taken until finish().
    if (waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      r.exited = true;  // not our child any more (cannot happen); count it as gone
      r.code = CLD_EXITED;
      continue;
    }
    if (info.si_pid == 0) continue;
    r.exited = true;
    r.code = info.si_code;
    r.status = info.si_status;
    if (r.failed() && !stopping_) {
      first_failure_ = static_cast<int>(i);
      begin_stop(SIGTERM);
    }
  }
}

std::string Job::killed_note() const {
  const std::vector<int> killed = ranks_where(&Rank::killed);
  if (killed.empty()) return "";
  return absl::StrFormat(" (SIGKILL after the %s grace: ranks %s)", grace_text(o_.grace_seconds),
                         rank_list(killed));
}

int Job::run() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::fprintf(stderr, "strata-run: cannot create a pipe: %s\n", sys::errno_text(errno).c_str());
    return 1;
  }
  wake_read_ = UniqueFd(fds[0]);
  wake_write_ = UniqueFd(fds[1]);
  signals_.emplace(wake_write_.get(), o_.tag_output);

  if (!start_ranks()) begin_stop(SIGTERM);
  g_pending[SIGCHLD].store(true);  // a rank may have exited before the loop looks

  std::vector<pollfd> fds_to_poll;
  while (true) {
    if (take_pending(SIGCHLD)) check_exits();
    for (const int sig : signals_->forwarded()) {
      if (take_pending(sig)) forward(sig);
    }
    if (all_exited()) break;
    if (stopping_ && !grace_over_ && Clock::now() >= deadline_) {
      grace_over_ = true;
      for (Rank& r : ranks_) {
        if (r.pid < 0 || r.exited) continue;
        r.killed = true;
        signal_group(r, SIGKILL);
      }
    }
    int timeout_ms = -1;
    if (stopping_ && !grace_over_) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 60'000));
    }
    fds_to_poll.clear();
    fds_to_poll.push_back({wake_read_.get(), POLLIN, 0});
    output_.add_poll_fds(fds_to_poll);
    const int ready = ::poll(fds_to_poll.data(), fds_to_poll.size(), timeout_ms);
    if (ready <= 0) continue;  // timeout or EINTR: the flags say what happened
    if (fds_to_poll[0].revents != 0) {
      char drain[256];
      while (::read(wake_read_.get(), drain, sizeof drain) > 0) {
      }
    }
    output_.handle_ready(fds_to_poll, 1);
  }
  return finish();
}

int Job::finish() {
  if (stopping_) {
    // The ranks are gone; what they started in their groups goes with them.
    for (const Rank& r : ranks_) signal_group(r, SIGKILL);
  }
  output_.drain_and_close();
  for (Rank& r : ranks_) {
    if (r.pid < 0) continue;
    int wait_status = 0;
    while (waitpid(r.pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
  signals_.reset();

  if (!start_error_.empty()) {
    const std::vector<int> stopped = ranks_where(&Rank::stopped);
    std::fprintf(stderr, "%s%s%s%s\n", prefix().c_str(), start_error_.c_str(),
                 stopped.empty() ? "" : ("; stopped ranks " + rank_list(stopped)).c_str(),
                 killed_note().c_str());
    return 1;
  }
  if (first_signal_ != 0) {
    std::fprintf(stderr, "%sgot %s (signal %d); forwarded it to ranks %s%s\n", prefix().c_str(),
                 signal_name(first_signal_).c_str(), first_signal_,
                 forwarded_to_.empty() ? "(none running)" : rank_list(forwarded_to_).c_str(),
                 killed_note().c_str());
    return 128 + first_signal_;
  }
  if (first_failure_ < 0) return 0;
  const Rank& f = ranks_[static_cast<size_t>(first_failure_)];
  std::vector<int> stopped = ranks_where(&Rank::stopped);
  std::string line = absl::StrFormat("%srank %d (pid %d) %s", prefix(),
                                     global(static_cast<size_t>(first_failure_)), f.pid,
                                     status_text(f.code, f.status));
  if (!stopped.empty()) line += "; stopped ranks " + rank_list(stopped);
  line += killed_note();
  std::fprintf(stderr, "%s\n", line.c_str());
  return f.code == CLD_EXITED ? f.status : 128 + f.status;
}

}  // namespace

int launch(const LaunchOptions& options) {
  Job job(options);
  return job.run();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i >= 2) {
      parts.push_back(absl::StrFormat("%d-%d", ranks[i], ranks[j]));
    } else {
      for (size_t k = i; k <= j; ++k) parts.push_back(absl::StrFormat("%d", ranks[k]));
    }
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev == nullptr) return absl::StrFormat("signal %d", sig);
  return absl::StrFormat("SIG%s", abbrev);
}

std::string status_text(int code, int status) {
  if (code == CLD_EXITED) return absl::StrFormat("exited with status %d", status);
  return absl::StrFormat("was killed by signal %d (%s)%s", status, signal_name(status),
                         code == CLD_DUMPED ? ", core dumped" : "");
}

}  // namespace strata::run
