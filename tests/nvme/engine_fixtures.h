// Helpers for the IoEngine tests: unlinked O_DIRECT files, aligned buffers, byte patterns, and a
// macro that runs one test body against both engines.
#pragma once

#include <absl/synchronization/mutex.h>
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "strata/nvme/io_engine.h"
#include "strata/testing/fault_injector.h"

namespace strata::testing {

inline constexpr uint64_t kBlock = 4096;

// An aligned, zeroed heap buffer; usable from any thread.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(uint64_t bytes)
      : bytes_(bytes), data_(static_cast<std::byte*>(std::aligned_alloc(kBlock, bytes))) {
    // No Catch2 assertion here: worker threads of the stress test allocate too.
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_.get(), 0, bytes);
  }
  std::byte* data() const { return data_.get(); }
  uint64_t size() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  uint64_t bytes_;
  std::unique_ptr<std::byte, Free> data_;
};

// An unlinked file (O_TMPFILE) in the temp directory, preallocated. O_DIRECT where the file
// system allows it.
class TempFile {
 public:
  explicit TempFile(uint64_t bytes) {
    const std::string dir = std::filesystem::temp_directory_path().string();
    fd_ = open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0 && errno == EINVAL) fd_ = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    INFO("O_TMPFILE in " << dir << ": " << std::strerror(errno));
    REQUIRE(fd_ >= 0);
    REQUIRE(fallocate(fd_, 0, 0, static_cast<off_t>(bytes)) == 0);
    name_ = "test swap file " + std::to_string(fd_) + " in " + dir;
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() { close(fd_); }
  IoFile io_file() const { return IoFile{.fd = fd_, .name = name_}; }
  const std::string& name() const { return name_; }

 private:
  int fd_ = -1;
  std::string name_;
};

inline std::vector<IoFile> io_files(const std::vector<std::unique_ptr<TempFile>>& files) {
  std::vector<IoFile> out;
  for (const auto& f : files) out.push_back(f->io_file());
  return out;
}

inline std::vector<std::unique_ptr<TempFile>> temp_files(int count, uint64_t bytes) {
  std::vector<std::unique_ptr<TempFile>> files;
  for (int i = 0; i < count; ++i) files.push_back(std::make_unique<TempFile>(bytes));
  return files;
}

// Bytes that differ for every (seed, position), so misplaced or stale data shows.
inline void fill(std::byte* p, uint64_t bytes, uint64_t seed) {
  for (uint64_t i = 0; i < bytes; i += 8) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ULL + i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    std::memcpy(p + i, &z, std::min<uint64_t>(8, bytes - i));
  }
}

inline bool matches(const std::byte* p, uint64_t bytes, uint64_t seed) {
  AlignedBuffer expected(bytes);
  fill(expected.data(), bytes, seed);
  return std::memcmp(p, expected.data(), bytes) == 0;
}

enum class Engine { kUring, kPsync };

inline std::unique_ptr<IoEngine> make_engine(Engine engine, const IoEngineOptions& options) {
  auto made = engine == Engine::kUring ? make_uring_engine(options) : make_psync_engine(options);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  return *std::move(made);
}

// Builders: designated initializers would trip -Wmissing-field-initializers on g++ 12.
inline IoRequest request(IoOp op, uint32_t file, uint64_t offset, void* buffer, uint64_t length,
                         IoCallback done = {}) {
  IoRequest r;
  r.op = op;
  r.file = file;
  r.offset = offset;
  r.buffer = buffer;
  r.length = length;
  r.done = std::move(done);
  return r;
}

inline IoEngineOptions engine_options(std::vector<IoFile> files, uint32_t depth = 32,
                                      std::vector<IoBuffer> fixed = {},
                                      std::shared_ptr<FaultInjector> faults = nullptr) {
  IoEngineOptions o;
  o.files = std::move(files);
  o.depth = depth;
  o.fixed_buffers = std::move(fixed);
  o.faults = std::move(faults);
  return o;
}

inline FaultRule rule(std::optional<IoOp> op, FaultRule::Action action) {
  FaultRule r;
  r.op = op;
  r.action = action;
  return r;
}

// Submits one batch and waits for it; returns the first error.
inline absl::Status run_batch(IoEngine& engine, std::vector<IoRequest>& batch) {
  IoWaiter waiter;
  for (IoRequest& r : batch) r.done = waiter.track();
  if (absl::Status s = engine.submit(batch); !s.ok()) return s;
  return waiter.wait();
}

inline absl::Status run_one(IoEngine& engine, IoOp op, uint32_t file, uint64_t offset, void* buffer,
                            uint64_t length) {
  std::vector<IoRequest> batch;
  batch.push_back(request(op, file, offset, buffer, length));
  return run_batch(engine, batch);
}

}  // namespace strata::testing

#define STRATA_ENGINE_CONCAT_INNER(a, b) a##b
#define STRATA_ENGINE_CONCAT(a, b) STRATA_ENGINE_CONCAT_INNER(a, b)

// STRATA_BOTH_ENGINES("name", "[tags]") { ... uses `Engine engine` ... }
#define STRATA_BOTH_ENGINES(name, tags) \
  STRATA_BOTH_ENGINES_IMPL(name, tags, STRATA_ENGINE_CONCAT(strata_engine_test_, __LINE__))
#define STRATA_BOTH_ENGINES_IMPL(name, tags, fn)                                 \
  static void fn(::strata::testing::Engine engine);                              \
  TEST_CASE(name " (io_uring)", tags) { fn(::strata::testing::Engine::kUring); } \
  TEST_CASE(name " (psync)", tags) { fn(::strata::testing::Engine::kPsync); }    \
  static void fn([[maybe_unused]] ::strata::testing::Engine engine)
