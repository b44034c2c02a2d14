// RawIo: offload-bench's NVMe baseline, the equivalent of
//   fio --ioengine=io_uring --direct=1 --rw=write|read --bs=BLOCK --iodepth=DEPTH
// with one fio job per directory, all jobs running at once (as strata stripes a tensor over every
// path, the baseline drives every path too). Each job has its own file (O_TMPFILE, so nothing is
// left behind even after SIGKILL), preallocated with fallocate as fio does, its own ring on its
// own thread, and one page-aligned buffer per slot. It keeps exactly DEPTH requests of BLOCK
// bytes in flight, refilling as completions arrive, sequentially over the file; plain
// READ/WRITE, no registered buffers or files (fio's defaults). Every completion is checked:
// errors fail the pass, short transfers are resubmitted for the remainder and -EAGAIN/-EINTR
// retried, as fio does.
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::bench {

struct RawIoOptions {
  std::vector<std::string> dirs;  // one job each
  uint64_t bytes = 0;             // in all; split evenly over the jobs in 4 KiB units
  uint64_t block = uint64_t{1} << 20;
  uint32_t depth = 32;
};

class RawIo {
 public:
  // Opens and preallocates the files and sets up the rings. Unavailable when io_uring is refused
  // here (the message says why); other errors name the directory and what to change.
  static absl::StatusOr<std::unique_ptr<RawIo>> create(const RawIoOptions& options);
  ~RawIo();
  RawIo(const RawIo&) = delete;
  RawIo& operator=(const RawIo&) = delete;

  // One sequential pass over every file, all jobs concurrently.
  absl::Status write_pass();
  absl::Status read_pass();

  uint64_t bytes() const { return bytes_; }
  // Directories whose file system refused O_DIRECT (the baseline then uses buffered I/O, as
  // SwapSpace does there).
  std::vector<std::string> buffered_dirs() const;

  struct Job;
  class Key {  // passkey: only create() constructs a RawIo
    friend class RawIo;
    Key() = default;
  };
  explicit RawIo(Key);

 private:
  absl::Status run(bool write);

  uint64_t bytes_ = 0;
  std::vector<std::unique_ptr<Job>> jobs_;
};

}  // namespace strata::bench
