// strata-run --tag-output: the ranks write into pipes; strata-run copies their output to its own
// stdout and stderr a whole line at a time, each line prefixed with "[rank N] ", so that lines of
// different ranks never mix. A partial line waits for its newline (or for the end of the stream,
// where a newline is added); a line longer than 64 KiB is passed on in pieces.
#pragma once

#include <absl/status/statusor.h>
#include <poll.h>
#include <sys/resource.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/base/unique_fd.h"

namespace strata::run {

class TaggedOutput {
 public:
  // The write ends a rank's stdout and stderr are dup2()ed onto; closed in strata-run once the
  // rank has been forked.
  struct ChildEnds {
    UniqueFd out;
    UniqueFd err;
  };

  // Two descriptors per rank, and room left for the ranks to exec: raises the soft RLIMIT_NOFILE
  // when needed. Returns the limit as it was when it raised it (the ranks get that one back),
  // nullopt when it was high enough; an error naming the fix when the hard limit is too low.
  absl::StatusOr<std::optional<struct rlimit>> reserve_fds(int nproc);

  // The pipes of one more rank.
  absl::StatusOr<ChildEnds> add_rank(int rank);

  // Appends a pollfd for every open pipe; handle_ready() takes the same vector and the index of
  // the first of them, and copies what is readable.
  void add_poll_fds(std::vector<pollfd>& fds) const;
  void handle_ready(const std::vector<pollfd>& fds, size_t first);

  // After the ranks are gone: copies what is left in the pipes, ends every partial line, closes.
  void drain_and_close();

 private:
  struct Stream {
    int rank = 0;
    int out_fd = -1;  // STDOUT_FILENO or STDERR_FILENO
    UniqueFd pipe;
    std::string pending;    // the start of a line not yet ended
    bool mid_line = false;  // a piece of an over-long line has been written already
  };

  // Reads once; returns false at the end of the stream (or on an error).
  bool read_some(Stream& s);
  void emit_lines(Stream& s);
  void end_stream(Stream& s);
  void write_out(int fd, std::string_view text);

  std::vector<Stream> streams_;
  bool out_dead_[3] = {false, false, false};  // a write to fd 1 or 2 failed (closed pipe)
};

}  // namespace strata::run
