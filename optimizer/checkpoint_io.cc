#include "strata/optimizer/checkpoint_io.h"

#include <absl/strings/str_cat.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "strata/base/unique_fd.h"

namespace strata {

absl::Status io_error(absl::string_view what, const std::string& path, int err) {
  const absl::StatusCode code = err == ENOSPC ? absl::StatusCode::kResourceExhausted
                                              : (err == ENOENT ? absl::StatusCode::kNotFound
                                                               : absl::StatusCode::kUnavailable);
  return absl::Status(code,
                      absl::StrCat("checkpoint: ", what, " ", path, ": ", std::strerror(err)));
}

absl::Status write_all(int fd, const void* data, uint64_t bytes, uint64_t offset,
                       const std::string& path) {
  const auto* p = static_cast<const std::byte*>(data);
  while (bytes > 0) {
    const ssize_t n = pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return io_error("writing", path, n < 0 ? errno : EIO);
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status read_all(int fd, void* data, uint64_t bytes, uint64_t offset,
                      const std::string& path) {
  auto* p = static_cast<std::byte*>(data);
  while (bytes > 0) {
    const ssize_t n = pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io_error("reading", path, errno);
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is truncated"));
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status sync_path(const std::string& path, bool directory) {
  UniqueFd fd(open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC));
  if (!fd) return io_error("opening", path, errno);
  if (fsync(fd.get()) != 0) return io_error("syncing", path, errno);
  return absl::OkStatus();
}

absl::Status replace_file(const std::string& directory, const std::string& path,
                          const std::string& text) {
  const std::string temp_path = path + ".tmp";
  {
    UniqueFd fd(open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) return io_error("creating", temp_path, errno);
    absl::Status status = write_all(fd.get(), text.data(), text.size(), 0, temp_path);
    if (status.ok() && fsync(fd.get()) != 0) status = io_error("syncing", temp_path, errno);
    if (!status.ok()) {
      unlink(temp_path.c_str());
      return status;
    }
  }
  if (rename(temp_path.c_str(), path.c_str()) != 0) {
    const int err = errno;
    unlink(temp_path.c_str());
    return io_error("replacing", path, err);
  }
  return sync_path(directory, /*directory=*/true);
}

}  // namespace strata
