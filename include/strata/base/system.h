// System calls strata makes in more than one place, behind one small interface (the model is
// mimalloc's prim.h): error text for errno values and files that never have a name.
#pragma once

#include <absl/status/statusor.h>

#include <string>

#include "strata/base/unique_fd.h"

namespace strata::sys {

// "No space left on device (errno 28)". Thread-safe (strerror_r), unlike strerror.
std::string errno_text(int err);

// An open file in `dir` that no name points at, so that nothing is left behind even after a
// crash and no other user can open it: O_TMPFILE, or where the file system lacks it (or refuses
// O_DIRECT with it) a file created 0600 with O_EXCL and unlinked at once. `flags` may add
// O_DIRECT. The error is the errno of the last attempt, for the caller to word.
struct UnnamedFile {
  UniqueFd fd;
  int error = 0;  // 0 when fd is open
};
UnnamedFile open_unnamed(const std::string& dir, int flags);

}  // namespace strata::sys
