// One swap file: created so that no name ever points at it (O_TMPFILE, or created 0600 and
// unlinked at once), opened O_DIRECT where the file system allows, and preallocated, so a disk
// that cannot hold it fails at start and writes are never punted to allocate blocks.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <string>

#include "strata/base/unique_fd.h"
#include "strata/nvme/io_engine.h"

namespace strata {

class SwapFile {
 public:
  // Creates and preallocates `bytes` in directory `dir`; `names` words the hints in errors.
  static absl::StatusOr<SwapFile> create(const std::string& dir, uint64_t bytes,
                                         const IoSettingNames& names);

  int fd() const { return fd_.get(); }
  const std::string& dir() const { return dir_; }
  uint64_t bytes() const { return bytes_; }
  // O_DIRECT alignment for buffers, offsets and lengths (at least 512).
  uint32_t alignment() const { return alignment_; }
  bool direct_io() const { return direct_io_; }
  const std::string& filesystem() const { return filesystem_; }
  // Things that work, but worse than they could ("buffered I/O: ..."); empty when none.
  const std::string& warning() const { return warning_; }

 private:
  SwapFile() = default;

  UniqueFd fd_;
  std::string dir_;
  uint64_t bytes_ = 0;
  uint32_t alignment_ = 4096;
  bool direct_io_ = true;
  std::string filesystem_;
  std::string warning_;
};

}  // namespace strata
