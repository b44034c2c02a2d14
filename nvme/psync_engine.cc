// PsyncEngine: a pool of min(depth, 64) threads, each taking one request at a time from a shared
// queue and finishing it with pread/pwrite under the same retry and short-transfer policy as
// io_uring. For machines where io_uring is refused (seccomp, gVisor, old kernels).
#include <absl/status/status.h>
#include <absl/strings/str_format.h>
#include <absl/synchronization/mutex.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <thread>

#include "io_common.h"
#include "strata/base/mutex.h"
#include "strata/testing/fault_injector.h"

namespace strata {
namespace {

using io::Attempt;

constexpr uint32_t kMaxThreads = 64;

class PsyncEngine final : public IoEngine {
 public:
  explicit PsyncEngine(const IoEngineOptions& options)
      : files_(options.files), faults_(options.faults), names_(options.names) {}

  ~PsyncEngine() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      cv_.SignalAll();
    }
    for (std::thread& t : threads_) t.join();  // each leaves once the queue is empty
  }

  void start(uint32_t threads) {
    threads_.reserve(threads);
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }

  std::string_view name() const override { return "psync"; }

  absl::Status submit(std::span<IoRequest> requests) override {
    if (absl::Status s = io::validate(requests, files_); !s.ok()) return s;
    const int64_t now = io::now_ns();
    MutexLock lock(&mu_);
    if (stopping_) {
      return absl::FailedPreconditionError("psync engine: submit() after shutdown began");
    }
    for (IoRequest& r : requests) queue_.emplace_back(std::move(r), now);
    if (requests.size() == 1) {
      cv_.Signal();
    } else {
      cv_.SignalAll();
    }
    return absl::OkStatus();
  }

  IoStats stats() const override { return stats_.snapshot(); }

 private:
  void run() {
    for (;;) {
      Attempt a;
      {
        MutexLock lock(&mu_);
        while (queue_.empty() && !stopping_) strata::wait(&cv_, &mu_);
        if (queue_.empty()) return;  // stopping, and nothing left to do
        a = std::move(queue_.front());
        queue_.pop_front();
      }
      stats_.started();
      execute(a);
      a.complete(stats_);
    }
  }

  void execute(Attempt& a) {
    const IoRequest& r = a.request();
    const IoFile& file = files_[r.file];
    for (;;) {
      const ssize_t n =
          r.op == IoOp::kRead
              ? pread(file.fd, a.buffer(), a.length(), static_cast<off_t>(a.offset()))
              : pwrite(file.fd, a.buffer(), a.length(), static_cast<off_t>(a.offset()));
      const int64_t raw = n < 0 ? -int64_t{errno} : int64_t{n};
      if (a.on_result(raw, faults_.get(), "psync", file, names_, stats_) !=
          Attempt::Next::kResubmit) {
        return;
      }
    }
  }

  const std::vector<IoFile> files_;
  const std::shared_ptr<FaultInjector> faults_;
  const IoSettingNames names_;
  io::StatsCounter stats_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<Attempt> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> make_psync_engine(const IoEngineOptions& options) {
  if (absl::Status s = io::check_options("psync", options); !s.ok()) return s;
  auto engine = std::make_unique<PsyncEngine>(options);
  engine->start(std::min(options.depth, kMaxThreads));
  return engine;
}

}  // namespace strata
