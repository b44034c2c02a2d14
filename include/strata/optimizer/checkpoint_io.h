// File helpers shared by the optimizer's checkpoints (optimizer_checkpoint.cc) and ZeRO's
// (zero_checkpoint.cc): whole-buffer pread/pwrite, fsync of a file or directory, errors that name
// the path. The manifests' text format is checkpoint_manifest.h.
#pragma once

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <cstdint>
#include <string>

namespace strata {

// "checkpoint: <what> <path>: <strerror>"; ENOSPC is ResourceExhausted, ENOENT NotFound.
absl::Status io_error(absl::string_view what, const std::string& path, int err);
absl::Status write_all(int fd, const void* data, uint64_t bytes, uint64_t offset,
                       const std::string& path);
// DataLoss when the file ends early.
absl::Status read_all(int fd, void* data, uint64_t bytes, uint64_t offset, const std::string& path);
absl::Status sync_path(const std::string& path, bool directory);
// Writes `text` to `path` through a temporary file, fsynced, renamed over it, directory fsynced.
absl::Status replace_file(const std::string& directory, const std::string& path,
                          const std::string& text);

}  // namespace strata
