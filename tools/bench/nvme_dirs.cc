#include "bench/nvme_dirs.h"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace strata::bench {
namespace {

// The temporary directory, for the signal handler (which may only make async-signal-safe calls:
// rmdir, signal, raise).
char g_temporary_dir[4096] = {};

extern "C" void remove_temporary_dir_and_reraise(int signal_number) {
  if (g_temporary_dir[0] != '\0') ::rmdir(g_temporary_dir);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

// The reaper: a small child process that removes the temporary directory once the bench is
// gone, however it ended. SIGKILL cannot be caught, but the kernel closes the bench's end of a
// pipe when it dies, and the reaper's read() then returns 0. Started before the bench has any
// thread (choose() runs first), so the child may do anything; it still keeps to plain syscalls.
int g_reaper_pipe = -1;
pid_t g_reaper_pid = -1;

void start_reaper(const char* dir) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;  // best effort: the handlers and destructor remain
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid == 0) {
    // Ctrl-C reaches the whole process group: outlive the bench to clean up after it.
    for (const int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
      std::signal(signal_number, SIG_IGN);
    }
    // Hold none of the bench's descriptors: not the pipe's write end (or EOF never comes), not
    // its stdout or stderr (a reader of them must see EOF when the bench ends).
    ::close(fds[1]);
    const int null_fd = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) {
      if (null_fd >= 0) ::dup2(null_fd, fd);
    }
    for (int fd = 3; fd < 1024; ++fd) {  // choose() runs first: few descriptors are open yet
      if (fd != fds[0]) ::close(fd);
    }
    char byte = 0;
    for (;;) {
      const ssize_t n = ::read(fds[0], &byte, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    ::rmdir(dir);  // empty: every file in it was O_TMPFILE; ENOENT when the bench removed it
    ::_exit(0);
  }
  ::close(fds[0]);
  g_reaper_pipe = fds[1];
  g_reaper_pid = pid;
}

void stop_reaper() {
  if (g_reaper_pipe < 0) return;
  ::close(g_reaper_pipe);  // the reaper sees EOF, finds the directory gone, and exits
  g_reaper_pipe = -1;
  while (::waitpid(g_reaper_pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  g_reaper_pid = -1;
}

}  // namespace

absl::StatusOr<NvmeDirs> NvmeDirs::choose(const std::vector<std::string>& configured) {
  if (!configured.empty()) return NvmeDirs(configured, false);
  const char* tmpdir = std::getenv("TMPDIR");
  std::string base = tmpdir != nullptr && tmpdir[0] != '\0' ? tmpdir : "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string pattern = base + "/strata-bench-XXXXXX";
  if (pattern.size() >= sizeof(g_temporary_dir)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "TMPDIR='%s' is too long; set a shorter TMPDIR or STRATA_NVME_PATHS", base));
  }
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot create a temporary directory for the NVMe paths under '%s' (%s): set TMPDIR to a "
        "writable directory, or STRATA_NVME_PATHS to the directories to measure",
        base, std::strerror(errno)));
  }
  std::memcpy(g_temporary_dir, pattern.c_str(), pattern.size() + 1);
  start_reaper(g_temporary_dir);
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    std::signal(signal_number, &remove_temporary_dir_and_reraise);
  }
  return NvmeDirs({pattern}, true);
}

NvmeDirs::NvmeDirs(NvmeDirs&& other) noexcept
    : paths_(std::move(other.paths_)), temporary_(std::exchange(other.temporary_, false)) {}

NvmeDirs::~NvmeDirs() {
  if (!temporary_) return;
  // The swap and baseline files are O_TMPFILE (or unlinked at once), so the directory is empty
  // even while they are still open.
  for (const std::string& path : paths_) ::rmdir(path.c_str());
  stop_reaper();
  g_temporary_dir[0] = '\0';
}

std::string NvmeDirs::describe() const {
  if (temporary_) {
    return absl::StrFormat("%s (temporary: STRATA_NVME_PATHS is unset; removed at exit)",
                           paths_.front());
  }
  return absl::StrFormat("%s (STRATA_NVME_PATHS)", absl::StrJoin(paths_, ","));
}

}  // namespace strata::bench
