#include "bench/raw_io.h"

#include <absl/strings/str_format.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "bench/common.h"
#include "strata/base/size.h"
#include "strata/base/system.h"
#include "strata/base/unique_fd.h"

namespace strata::bench {
namespace {

using sys::errno_text;

// Anonymous memory: page-aligned, as fio's buffers are, and released with the job.
class Mapping {
 public:
  static absl::StatusOr<Mapping> create(uint64_t bytes) {
    void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "raw baseline: cannot map %d bytes of buffers (%s): lower STRATA_IO_DEPTH or "
          "STRATA_IO_BLOCK",
          bytes, errno_text(errno)));
    }
    return Mapping(static_cast<std::byte*>(data), bytes);
  }
  Mapping(Mapping&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_) {}
  Mapping& operator=(Mapping&&) = delete;
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

 private:
  Mapping(std::byte* data, uint64_t bytes) : data_(data), bytes_(bytes) {}
  std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// A file with no name (sys::open_unnamed), so a crash leaves nothing behind; O_DIRECT where the
// file system takes it.
absl::StatusOr<UniqueFd> open_unnamed(const std::string& dir, bool* direct) {
  sys::UnnamedFile file = sys::open_unnamed(dir, O_DIRECT);
  *direct = static_cast<bool>(file.fd);
  if (!file.fd && file.error == EINVAL) file = sys::open_unnamed(dir, 0);  // O_DIRECT refused
  if (file.fd) return std::move(file.fd);
  const int error = file.error;
  return absl::PermissionDeniedError(
      absl::StrFormat("raw baseline: cannot create its file in '%s': %s; check that the directory "
                      "is writable or choose another in STRATA_NVME_PATHS",
                      dir, errno_text(error)));
}

}  // namespace

struct RawIo::Job {
  std::string dir;
  UniqueFd fd;
  bool direct = true;
  uint64_t bytes = 0;  // this job's share, from offset 0 of its file
  uint64_t block = 0;
  uint32_t depth = 0;
  std::optional<Mapping> buffers;  // depth slots of `block` bytes
  io_uring ring{};
  bool ring_ready = false;

  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    if (ring_ready) io_uring_queue_exit(&ring);
  }

  absl::Status run(bool write);
};

absl::Status RawIo::Job::run(bool write) {
  struct Slot {
    uint64_t offset = 0, length = 0, done = 0;
    int retries = 0;
  };
  std::vector<Slot> slots(depth);
  uint64_t next = 0;
  uint32_t in_flight = 0;
  absl::Status first_error;

  // Queues slot `s` (its remainder after a short transfer). Never short of SQEs: the ring has
  // `depth` entries and at most `depth` requests are outstanding.
  auto queue = [&](uint32_t s) {
    Slot& slot = slots[s];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    std::byte* buffer = buffers->data() + uint64_t{s} * block + slot.done;
    const auto length = static_cast<unsigned>(slot.length - slot.done);
    if (write) {
      io_uring_prep_write(sqe, fd.get(), buffer, length, slot.offset + slot.done);
    } else {
      io_uring_prep_read(sqe, fd.get(), buffer, length, slot.offset + slot.done);
    }
    sqe->user_data = s;
  };
  auto start_next = [&](uint32_t s) {
    if (next >= bytes || !first_error.ok()) return false;
    slots[s] = Slot{next, std::min(block, bytes - next), 0, 0};
    next += slots[s].length;
    queue(s);
    return true;
  };

  for (uint32_t s = 0; s < depth; ++s) {
    if (start_next(s)) ++in_flight;
  }
  std::vector<io_uring_cqe*> cqes(depth);
  while (in_flight > 0) {
    // One system call submits the refills of the last batch and waits for the next completion.
    const int submitted = io_uring_submit_and_wait(&ring, 1);
    if (submitted < 0 && submitted != -EINTR && submitted != -EAGAIN) {
      return absl::InternalError(absl::StrFormat(
          "raw baseline: io_uring_submit_and_wait in '%s': %s", dir, errno_text(-submitted)));
    }
    const unsigned count = io_uring_peek_batch_cqe(&ring, cqes.data(), depth);
    for (unsigned i = 0; i < count; ++i) {
      const auto s = static_cast<uint32_t>(cqes[i]->user_data);
      const int res = cqes[i]->res;
      Slot& slot = slots[s];
      const uint64_t remaining = slot.length - slot.done;
      if ((res == -EAGAIN || res == -EINTR) && ++slot.retries < 64) {
        queue(s);
        continue;
      }
      if (res <= 0) {
        if (first_error.ok()) {
          first_error = absl::DataLossError(absl::StrFormat(
              "raw baseline: %s of %d bytes at offset %d of the file in '%s' failed: %s",
              write ? "write" : "read", remaining, slot.offset + slot.done, dir,
              res == 0 ? "end of file" : errno_text(-res)));
        }
      } else if (static_cast<uint64_t>(res) < remaining) {
        slot.done += static_cast<uint64_t>(res);  // short transfer: the remainder goes again
        queue(s);
        continue;
      }
      if (!start_next(s)) --in_flight;
    }
    io_uring_cq_advance(&ring, count);
  }
  return first_error;  // every request has completed, so the buffers are free again
}

absl::StatusOr<std::unique_ptr<RawIo>> RawIo::create(const RawIoOptions& options) {
  if (options.dirs.empty() || options.block == 0 || options.block % kPage != 0 ||
      options.depth == 0 || options.bytes % kPage != 0) {
    return absl::InvalidArgumentError(
        "raw baseline: needs directories, a block and a byte count in whole 4 KiB pages and a "
        "depth of at least 1");
  }
  auto raw = std::make_unique<RawIo>(Key());
  raw->bytes_ = options.bytes;
  const uint64_t pages = options.bytes / kPage;
  const uint64_t jobs = options.dirs.size();
  for (uint64_t j = 0; j < jobs; ++j) {
    auto job = std::make_unique<Job>();
    job->dir = options.dirs[j];
    job->bytes = (pages / jobs + (j < pages % jobs ? 1 : 0)) * kPage;
    job->block = options.block;
    job->depth = options.depth;
    auto fd = open_unnamed(job->dir, &job->direct);
    if (!fd.ok()) return fd.status();
    job->fd = *std::move(fd);
    // fio lays its file out before the run; preallocation also makes ENOSPC appear now.
    if (job->bytes > 0 && ::fallocate(job->fd.get(), 0, 0, static_cast<off_t>(job->bytes)) != 0) {
      const int error = errno;
      if (error != EOPNOTSUPP || ::ftruncate(job->fd.get(), static_cast<off_t>(job->bytes)) != 0) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "raw baseline: cannot preallocate %s in '%s': %s; free space there or lower --bytes",
            format_bytes(job->bytes), job->dir, errno_text(error)));
      }
    }
    auto buffers = Mapping::create(uint64_t{job->depth} * job->block);
    if (!buffers.ok()) return buffers.status();
    fill_pattern(buffers->data(), uint64_t{job->depth} * job->block, j + 1);
    job->buffers.emplace(*std::move(buffers));
    if (const int ret = io_uring_queue_init(job->depth, &job->ring, 0); ret < 0) {
      return absl::UnavailableError(absl::StrFormat(
          "io_uring is refused here (io_uring_queue_init: %s), so the fio-equivalent baseline "
          "cannot run",
          errno_text(-ret)));
    }
    job->ring_ready = true;
    raw->jobs_.push_back(std::move(job));
  }
  return raw;
}

RawIo::RawIo(Key) {}
RawIo::~RawIo() = default;

absl::Status RawIo::write_pass() { return run(true); }
absl::Status RawIo::read_pass() { return run(false); }

absl::Status RawIo::run(bool write) {
  if (jobs_.size() == 1) return jobs_[0]->run(write);
  std::vector<absl::Status> results(jobs_.size());
  {
    std::vector<std::jthread> threads;
    threads.reserve(jobs_.size());
    for (size_t j = 0; j < jobs_.size(); ++j) {
      threads.emplace_back([&, j] { results[j] = jobs_[j]->run(write); });
    }
  }  // jthreads join here
  for (absl::Status& status : results) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

std::vector<std::string> RawIo::buffered_dirs() const {
  std::vector<std::string> dirs;
  for (const auto& job : jobs_) {
    if (!job->direct) dirs.push_back(job->dir);
  }
  return dirs;
}

}  // namespace strata::bench
