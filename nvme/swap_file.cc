#include "swap_file.h"

#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "io_common.h"
#include "strata/base/format_bytes.h"
#include "strata/base/system.h"

namespace strata {
namespace {

using sys::errno_text;

std::string filesystem_name(int fd) {
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return "unknown";
  switch (static_cast<unsigned long>(fs.f_type)) {
    case EXT4_SUPER_MAGIC:
      return "ext4";
    case XFS_SUPER_MAGIC:
      return "xfs";
    case BTRFS_SUPER_MAGIC:
      return "btrfs";
    case TMPFS_MAGIC:
      return "tmpfs";
    case NFS_SUPER_MAGIC:
      return "nfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlayfs";
    case 0x2fc12fc1:
      return "zfs";
    case 0x65735546:
      return "fuse";
    default:
      return absl::StrFormat("unknown (0x%x)", static_cast<unsigned long>(fs.f_type));
  }
}

// O_DIRECT alignment as the file system reports it (statx STATX_DIOALIGN, Linux 6.1+). Where it
// does not say, 4096: a multiple of every logical block size in use (512 and 4096).
uint32_t direct_io_alignment(int fd) {
#if defined(STATX_DIOALIGN)
  struct statx info {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &info) == 0 &&
      (info.stx_mask & STATX_DIOALIGN) != 0 && info.stx_dio_offset_align != 0) {
    return std::max<uint32_t>({512, info.stx_dio_mem_align, info.stx_dio_offset_align});
  }
#endif
  return 4096;
}

}  // namespace

absl::StatusOr<SwapFile> SwapFile::create(const std::string& dir, uint64_t bytes,
                                          const IoSettingNames& names) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    const int error = errno;
    return absl::NotFoundError(
        absl::StrFormat("%s entry '%s': %s; create the directory or fix the path", names.paths, dir,
                        errno_text(error)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s entry '%s' is not a directory; name a directory on an NVMe drive", names.paths, dir));
  }

  SwapFile file;
  file.dir_ = dir;
  file.bytes_ = bytes;
  sys::UnnamedFile unnamed = sys::open_unnamed(dir, O_DIRECT);
  if (!unnamed.fd && unnamed.error == EINVAL) {
    // The file system refuses O_DIRECT (older tmpfs, some FUSE and network file systems).
    // Buffered I/O still works, at the cost of a page-cache copy of everything swapped.
    unnamed = sys::open_unnamed(dir, 0);
    if (unnamed.fd) {
      file.direct_io_ = false;
      file.warning_ = absl::StrFormat(
          "swap file in '%s': the file system does not support O_DIRECT, so swap uses buffered "
          "I/O (every byte also passes through the page cache); point %s at an ext4 or xfs "
          "directory on an NVMe drive",
          dir, names.paths);
    }
  }
  const int error = unnamed.error;
  if (!unnamed.fd) {
    if (error == EACCES || error == EPERM || error == EROFS) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "%s entry '%s' is not writable (%s); choose a directory this user can write to",
          names.paths, dir, errno_text(error)));
    }
    return absl::InternalError(
        absl::StrFormat("cannot create a swap file in '%s': %s", dir, errno_text(error)));
  }
  const int fd = unnamed.fd.get();
  file.fd_ = std::move(unnamed.fd);
  file.filesystem_ = filesystem_name(fd);
  file.alignment_ = file.direct_io_ ? direct_io_alignment(fd) : 512;

  if (fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    const int fallocate_error = errno;
    if (fallocate_error == ENOSPC || fallocate_error == EFBIG || fallocate_error == EDQUOT) {
      struct statvfs fs {};
      const uint64_t free_bytes = fstatvfs(fd, &fs) == 0 ? uint64_t{fs.f_bavail} * fs.f_frsize : 0;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot preallocate %s of swap in '%s': %s (%s free there); lower %s or free space on "
          "that drive",
          format_bytes(bytes), dir, errno_text(fallocate_error), format_bytes(free_bytes),
          names.bytes_per_path));
    }
    if (fallocate_error != EOPNOTSUPP) {
      return absl::InternalError(absl::StrFormat("cannot preallocate %s of swap in '%s': %s",
                                                 format_bytes(bytes), dir,
                                                 errno_text(fallocate_error)));
    }
    // No fallocate on this file system: size the file; a full disk then shows up on write.
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int truncate_error = errno;
      return absl::InternalError(absl::StrFormat("cannot size the swap file in '%s' to %s: %s", dir,
                                                 format_bytes(bytes), errno_text(truncate_error)));
    }
    file.warning_ += absl::StrFormat(
        "%sswap file in '%s': the file system cannot preallocate (fallocate: %s); a full disk "
        "will show up as write errors",
        file.warning_.empty() ? "" : "; ", dir, errno_text(fallocate_error));
  }
  return file;
}

}  // namespace strata
