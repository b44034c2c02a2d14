#include "run/tagged_output.h"

#include <absl/status/status.h>
#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "strata/base/system.h"

namespace strata::run {
namespace {

constexpr size_t kMaxPending = 64 * 1024;

}  // namespace

absl::StatusOr<std::optional<struct rlimit>> TaggedOutput::reserve_fds(int nproc) {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return std::nullopt;
  const rlim_t wanted = 2 * static_cast<rlim_t>(nproc) + 64;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return std::nullopt;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < wanted) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--tag-output with -n %d needs %d open files (two pipes per rank), and the limit is %d: "
        "raise it (ulimit -n %d) or drop --tag-output",
        nproc, static_cast<uint64_t>(wanted), static_cast<uint64_t>(limit.rlim_max),
        static_cast<uint64_t>(wanted)));
  }
  struct rlimit raised = limit;
  raised.rlim_cur = wanted;
  if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--tag-output with -n %d needs %d open files, and raising the limit failed: %s", nproc,
        static_cast<uint64_t>(wanted), sys::errno_text(errno)));
  }
  return limit;
}

absl::StatusOr<TaggedOutput::ChildEnds> TaggedOutput::add_rank(int rank) {
  ChildEnds ends;
  for (const int out_fd : {STDOUT_FILENO, STDERR_FILENO}) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      const int err = errno;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot create the pipes of --tag-output: %s%s", sys::errno_text(err),
          err == EMFILE ? "; raise the open-file limit (ulimit -n) or drop --tag-output" : ""));
    }
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    Stream& s = streams_.emplace_back();
    s.rank = rank;
    s.out_fd = out_fd;
    s.pipe = UniqueFd(fds[0]);
    (out_fd == STDOUT_FILENO ? ends.out : ends.err) = UniqueFd(fds[1]);
  }
  return ends;
}

void TaggedOutput::add_poll_fds(std::vector<pollfd>& fds) const {
  for (const Stream& s : streams_) {
    if (s.pipe) fds.push_back({s.pipe.get(), POLLIN, 0});
  }
}

void TaggedOutput::handle_ready(const std::vector<pollfd>& fds, size_t first) {
  size_t i = first;
  for (Stream& s : streams_) {
    if (!s.pipe) continue;
    const short revents = fds[i++].revents;
    if (revents == 0) continue;
    if (!read_some(s)) end_stream(s);
  }
}

void TaggedOutput::drain_and_close() {
  // A process the rank left behind may keep writing; a bounded number of rounds then.
  for (int round = 0; round < 64; ++round) {
    std::vector<pollfd> fds;
    add_poll_fds(fds);
    if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) break;
    handle_ready(fds, 0);
  }
  for (Stream& s : streams_) {
    if (s.pipe) end_stream(s);
  }
}

bool TaggedOutput::read_some(Stream& s) {
  char buffer[16384];
  const ssize_t n = ::read(s.pipe.get(), buffer, sizeof buffer);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  s.pending.append(buffer, static_cast<size_t>(n));
  emit_lines(s);
  return true;
}

void TaggedOutput::emit_lines(Stream& s) {
  const std::string prefix = absl::StrFormat("[rank %d] ", s.rank);
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (!s.mid_line) out += prefix;
    out.append(s.pending, start, nl + 1 - start);
    s.mid_line = false;
  }
  s.pending.erase(0, start);
  if (s.pending.size() >= kMaxPending) {
    if (!s.mid_line) out += prefix;
    out += s.pending;
    s.pending.clear();
    s.mid_line = true;
  }
  write_out(s.out_fd, out);
}

void TaggedOutput::end_stream(Stream& s) {
  if (!s.pending.empty() || s.mid_line) {
    std::string out = s.mid_line ? "" : absl::StrFormat("[rank %d] ", s.rank);
    out += s.pending;
    out += '\n';
    s.pending.clear();
    s.mid_line = false;
    write_out(s.out_fd, out);
  }
  s.pipe = UniqueFd();
}

void TaggedOutput::write_out(int fd, std::string_view text) {
  while (!text.empty() && !out_dead_[fd]) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n >= 0) {
      text.remove_prefix(static_cast<size_t>(n));
    } else if (errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else if (errno != EINTR) {
      out_dead_[fd] = true;  // closed or broken: the rest of this stream's output is dropped
    }
  }
}

}  // namespace strata::run
