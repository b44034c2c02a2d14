#include "strata/base/system.h"

#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace strata::sys {

std::string errno_text(int err) {
  char buffer[128];
  // GNU strerror_r returns a pointer to the text (not necessarily `buffer`).
  const char* text = strerror_r(err, buffer, sizeof buffer);
  return absl::StrFormat("%s (errno %d)", text, err);
}

UnnamedFile open_unnamed(const std::string& dir, int flags) {
  UnnamedFile file;
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | flags, 0600);
  if (fd >= 0) {
    file.fd = UniqueFd(fd);
    return file;
  }
  file.error = errno;
  if (file.error != EOPNOTSUPP && file.error != EISDIR && file.error != EINVAL) return file;
  // No O_TMPFILE here (or O_DIRECT refused with it): a named file, unlinked before anyone can use
  // the name. Mode 0600 and O_EXCL (mkostemp) keep other users out during that instant.
  std::string path = dir + "/.strata-XXXXXX";
  UniqueFd named(::mkostemp(path.data(), O_CLOEXEC));
  if (!named) {
    file.error = errno;
    return file;
  }
  ::unlink(path.c_str());
  if ((flags & O_DIRECT) != 0 && ::fcntl(named.get(), F_SETFL, O_DIRECT) != 0) {
    file.error = errno;
    return file;
  }
  file.fd = std::move(named);
  file.error = 0;
  return file;
}

}  // namespace strata::sys
