// UringEngine: one io_uring per worker thread (never shared), registered files and buffers,
// batched submissions, at most `depth` requests in flight per worker.
//
// A worker sleeps in io_uring_enter(GETEVENTS). To wake it when requests arrive, each ring keeps
// a READ of an eventfd armed; submit() writes the eventfd only when the worker said (under its
// mutex) that it is about to sleep, so an idle engine costs no system calls and a busy one none
// extra. The worker re-arms the read with its next batch.
#include <absl/status/status.h>
#include <absl/strings/str_format.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <deque>
#include <thread>

#include "io_common.h"
#include "strata/base/mutex.h"
#include "strata/base/unique_fd.h"
#include "strata/testing/fault_injector.h"
#include "uring_buffers.h"

namespace strata {
namespace {

using io::Attempt;
using io::errno_text;

constexpr uint64_t kWakeTag = UINT64_MAX;

// Owns an initialised ring.
class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    if (live_) io_uring_queue_exit(&ring_);
  }
  int init(unsigned entries) {
    const int ret = io_uring_queue_init(entries, &ring_, 0);
    live_ = ret == 0;
    return ret;
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  bool live_ = false;
};

std::string setup_failure(int err) {
  std::string why;
  if (err == EPERM) {
    why =
        "blocked by a seccomp filter (Docker's default profile) or by the "
        "kernel.io_uring_disabled sysctl";
    char value = 0;
    if (UniqueFd f(open("/proc/sys/kernel/io_uring_disabled", O_RDONLY | O_CLOEXEC));
        f.get() >= 0 && read(f.get(), &value, 1) == 1 && value >= '0' && value <= '9') {
      why += absl::StrFormat(" (it is %c here)", value);
    }
  } else if (err == ENOSYS) {
    why =
        "the kernel has no io_uring (older than 5.1, built without it, or a sandbox such as "
        "gVisor)";
  } else if (err == ENOMEM) {
    why = "not enough locked memory for the ring (raise RLIMIT_MEMLOCK: ulimit -l)";
  } else {
    why = "unexpected error";
  }
  return absl::StrFormat("io_uring_queue_init failed: %s: %s", errno_text(err), why);
}

// What every worker of an engine shares; read-only once the workers run, except the counters
// and the registration state (UringBuffers).
struct Shared {
  Shared(const IoEngineOptions& options, uint32_t workers)
      : files(options.files),
        buffers(options.fixed_buffers, options.lazy_buffers, workers, options.faults),
        faults(options.faults),
        names(options.names) {}
  std::vector<IoFile> files;
  UringBuffers buffers;
  std::shared_ptr<FaultInjector> faults;
  IoSettingNames names;
  io::StatsCounter stats;
};

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> create(Shared& shared, uint32_t index,
                                                        uint32_t depth, std::string* warning);
  ~Worker() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      cv_.Signal();
    }
    wake();
    if (thread_.joinable()) thread_.join();
  }

  // Takes the requests of `batch` whose file belongs to this worker (file % workers == index).
  void enqueue(std::span<IoRequest> batch, uint32_t index, uint32_t workers, int64_t now) {
    bool wake_it = false;
    {
      MutexLock lock(&mu_);
      for (IoRequest& r : batch) {
        if (r.file % workers == index) pending_.emplace_back(std::move(r), now);
      }
      if (!dead_.ok()) {
        cv_.Signal();
      } else if (waiting_) {
        waiting_ = false;  // one write wakes it; later submitters need not write again
        wake_it = true;
      }
    }
    if (wake_it) wake();
  }

  // Use create(); public only for make_unique.
  Worker(Shared& shared, uint32_t index, uint32_t depth, int event_fd)
      : shared_(shared),
        index_(index),
        slots_(depth),
        state_(depth, SlotState::kFree),
        buf_index_(depth, -1),
        event_(event_fd) {
    free_.reserve(depth);
    for (uint32_t i = depth; i-- > 0;) free_.push_back(i);
    ready_.reserve(depth);
    queued_.reserve(depth + 1);
    reaped_.reserve(2 * (depth + 1));
    finished_.reserve(depth);
  }

 private:
  enum class SlotState { kFree, kReady, kInKernel };

  void wake() {
    const uint64_t one = 1;
    while (write(event_.get(), &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

  absl::Status start_ring(uint32_t depth, std::string* warning);
  void run();
  void take_pending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void prepare();
  void reap();
  void refill();
  void account_submitted(int submitted, size_t before);
  void run_completions();
  void finish(uint32_t slot);
  void die(absl::Status why);
  void drain_dead();

  Shared& shared_;
  const uint32_t index_;  // this worker's ring among the engine's (UringBuffers)
  absl::Mutex mu_;
  absl::CondVar cv_;  // only a dead worker sleeps on it
  std::deque<Attempt> pending_ ABSL_GUARDED_BY(mu_);
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;  // about to sleep in the ring: write the eventfd
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status dead_ ABSL_GUARDED_BY(mu_);  // an unrecoverable ring error

  // Worker thread only.
  std::vector<Attempt> slots_;
  std::vector<SlotState> state_;
  std::vector<int> buf_index_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> ready_;   // slots whose next attempt needs an SQE
  std::vector<uint64_t> queued_;  // tags of SQEs prepared but not yet taken by the kernel
  std::vector<std::pair<uint64_t, int32_t>> reaped_;
  std::vector<Attempt> finished_;  // completed this round; callbacks run after the refill
  uint32_t in_kernel_ = 0;
  bool wake_armed_ = false;  // the eventfd READ is prepared or in the kernel
  uint64_t wake_value_ = 0;  // its target
  bool fixed_files_ = false;

  // Destroyed in reverse: the thread is joined (destructor), then the ring exits, then the
  // eventfd its armed READ refers to is closed.
  UniqueFd event_;
  Ring ring_;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<Worker>> Worker::create(Shared& shared, uint32_t index,
                                                       uint32_t depth, std::string* warning) {
  const int event_fd = eventfd(0, EFD_CLOEXEC);
  if (event_fd < 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("io_uring engine: eventfd: %s", errno_text(errno)));
  }
  auto worker = std::make_unique<Worker>(shared, index, depth, event_fd);
  if (absl::Status s = worker->start_ring(depth, warning); !s.ok()) return s;
  worker->thread_ = std::thread([w = worker.get()] { w->run(); });
  return worker;
}

absl::Status Worker::start_ring(uint32_t depth, std::string* warning) {
  // Room for every slot's SQE plus the eventfd READ; the CQ ring is twice that.
  if (const int ret = ring_.init(std::bit_ceil(depth + 1)); ret < 0) {
    return absl::Status(absl::ErrnoToStatusCode(-ret), setup_failure(-ret));
  }
  io_uring* ring = ring_.get();
  if (!shared_.files.empty()) {
    std::vector<int> fds;
    for (const IoFile& f : shared_.files) fds.push_back(f.fd);
    const int ret = io_uring_register_files(ring, fds.data(), static_cast<unsigned>(fds.size()));
    fixed_files_ = ret == 0;
    if (ret < 0 && warning->empty()) {
      *warning = absl::StrFormat("io_uring: files not registered (%s); using plain descriptors",
                                 errno_text(-ret));
    }
  }
  if (std::string w = shared_.buffers.attach(index_, ring); !w.empty() && warning->empty()) {
    *warning = std::move(w);
  }
  // The wake-up path is itself a probe: a READ on the eventfd must complete.
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  io_uring_prep_read(sqe, event_.get(), &wake_value_, sizeof wake_value_, 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
  wake();
  int ret = 0;
  while ((ret = io_uring_submit_and_wait(ring, 1)) == -EINTR) {
  }
  io_uring_cqe* cqe = nullptr;
  if (ret >= 0) {
    while ((ret = io_uring_wait_cqe(ring, &cqe)) == -EINTR) {
    }
  }
  if (ret >= 0) {
    ret = cqe->res;
    io_uring_cqe_seen(ring, cqe);
  }
  if (ret != static_cast<int>(sizeof wake_value_)) {
    const int err = ret < 0 ? -ret : EIO;
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrFormat(
            "an io_uring READ of an eventfd failed: %s%s", errno_text(err),
            err == EINVAL ? " (the kernel or sandbox lacks IORING_OP_READ, Linux 5.6+)" : ""));
  }
  return absl::OkStatus();
}

void Worker::take_pending() {
  while (!free_.empty() && !pending_.empty()) {
    const uint32_t s = free_.back();
    free_.pop_back();
    slots_[s] = std::move(pending_.front());
    pending_.pop_front();
    const IoRequest& r = slots_[s].request();
    buf_index_[s] = shared_.buffers.fixed_index(index_, r.buffer, r.length);
    if (buf_index_[s] >= 0) shared_.stats.fixed();
    shared_.stats.started();
    state_[s] = SlotState::kReady;
    ready_.push_back(s);
  }
}

void Worker::run() {
  uint32_t failed_submits = 0;
  for (;;) {
    {
      MutexLock lock(&mu_);
      take_pending();
      if (stopping_ && pending_.empty() && free_.size() == slots_.size()) return;
      // The worker now sleeps until a completion or a wake-up. New requests need a wake-up only
      // if a slot is free for them; otherwise the next completion brings the worker back.
      waiting_ = !free_.empty();
    }
    prepare();
    const size_t before = queued_.size();
    const int ret = io_uring_submit_and_wait(ring_.get(), 1);
    if (ret >= 0) {
      account_submitted(ret, before);
      failed_submits = 0;
    } else if (ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) {
      // Unsubmitted SQEs stay in the ring for the next call. Wait for completions to free
      // kernel resources, or back off briefly if none are coming.
      if (++failed_submits > IoEngine::kMaxRetries) {
        die(absl::UnavailableError(absl::StrFormat("io_uring_enter kept failing: %s; lower %s",
                                                   errno_text(-ret), shared_.names.depth)));
        break;
      }
      io_uring_cqe* cqe = nullptr;
      if (in_kernel_ > 0) {
        (void)io_uring_wait_cqe(ring_.get(), &cqe);
      } else {
        absl::SleepFor(absl::Milliseconds(1));
      }
    } else {
      die(absl::InternalError(
          absl::StrFormat("io_uring_enter failed: %s; the ring is unusable: set %s to psync",
                          errno_text(-ret), shared_.names.engine)));
      break;
    }
    reap();
    refill();
    run_completions();
  }
  drain_dead();
}

// The kernel takes SQEs in order.
void Worker::account_submitted(int submitted, size_t before) {
  const size_t taken = std::min<size_t>(static_cast<size_t>(submitted), before);
  for (size_t i = 0; i < taken; ++i) {
    if (queued_[i] == kWakeTag) continue;
    state_[queued_[i]] = SlotState::kInKernel;
    ++in_kernel_;
  }
  queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(taken));
}

// Hands the slots just freed (and any resubmissions) to the kernel before the completion
// callbacks run: callbacks may hash a whole stripe unit, and the drive should not idle meanwhile.
void Worker::refill() {
  if (finished_.empty() && ready_.empty()) return;
  {
    MutexLock lock(&mu_);
    take_pending();
  }
  if (ready_.empty()) return;
  prepare();
  const size_t before = queued_.size();
  const int ret = io_uring_submit(ring_.get());
  // On failure the SQEs stay queued; the main loop's submit retries and handles the error.
  if (ret >= 0) account_submitted(ret, before);
}

void Worker::run_completions() {
  for (Attempt& done : finished_) done.complete(shared_.stats);
  finished_.clear();
}

void Worker::prepare() {
  io_uring* ring = ring_.get();
  // The SQ has room for every slot plus the wake-up READ, so io_uring_get_sqe only fails if the
  // kernel has not taken earlier SQEs (a failed submit): those go in first, the rest later.
  if (!wake_armed_) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) return;
    io_uring_prep_read(sqe, event_.get(), &wake_value_, sizeof wake_value_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
    queued_.push_back(kWakeTag);
    wake_armed_ = true;
  }
  size_t prepared = 0;
  for (; prepared < ready_.size(); ++prepared) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) break;
    const uint32_t s = ready_[prepared];
    Attempt& a = slots_[s];
    const IoRequest& r = a.request();
    const int fd = fixed_files_ ? static_cast<int>(r.file) : shared_.files[r.file].fd;
    const auto len = static_cast<unsigned>(a.length());
    const int index = buf_index_[s];
    if (r.op == IoOp::kRead) {
      if (index >= 0) {
        io_uring_prep_read_fixed(sqe, fd, a.buffer(), len, a.offset(), index);
      } else {
        io_uring_prep_read(sqe, fd, a.buffer(), len, a.offset());
      }
    } else if (index >= 0) {
      io_uring_prep_write_fixed(sqe, fd, a.buffer(), len, a.offset(), index);
    } else {
      io_uring_prep_write(sqe, fd, a.buffer(), len, a.offset());
    }
    if (fixed_files_) io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data64(sqe, s);
    queued_.push_back(s);
  }
  ready_.erase(ready_.begin(), ready_.begin() + static_cast<std::ptrdiff_t>(prepared));
}

void Worker::reap() {
  io_uring* ring = ring_.get();
  unsigned head = 0;
  unsigned seen = 0;
  io_uring_cqe* cqe = nullptr;
  io_uring_for_each_cqe(ring, head, cqe) {
    reaped_.emplace_back(io_uring_cqe_get_data64(cqe), cqe->res);
    ++seen;
  }
  io_uring_cq_advance(ring, seen);
  for (const auto& [tag, res] : reaped_) {
    if (tag == kWakeTag) {
      wake_armed_ = false;  // re-armed with the next batch, before the worker sleeps again
      continue;
    }
    const auto s = static_cast<uint32_t>(tag);
    --in_kernel_;
    Attempt& a = slots_[s];
    const Attempt::Next next =
        a.on_result(res, shared_.faults.get(), "io_uring", shared_.files[a.request().file],
                    shared_.names, shared_.stats);
    if (next == Attempt::Next::kResubmit) {
      state_[s] = SlotState::kReady;
      ready_.push_back(s);
    } else {
      finish(s);
    }
  }
  reaped_.clear();
}

void Worker::finish(uint32_t s) {
  slots_[s].record(shared_.stats);  // it has left the device: stats must not count it in flight
  finished_.push_back(std::move(slots_[s]));
  slots_[s] = Attempt();
  state_[s] = SlotState::kFree;
  free_.push_back(s);
}

// The ring failed in a way retrying cannot fix: fail what the kernel never took, and from now on
// every request sent to this worker.
void Worker::die(absl::Status why) {
  {
    MutexLock lock(&mu_);
    dead_ = why;
  }
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    if (state_[s] != SlotState::kReady) continue;
    Attempt a = std::move(slots_[s]);
    state_[s] = SlotState::kFree;
    free_.push_back(s);
    a.complete_with(why, shared_.stats);
  }
  ready_.clear();
}

void Worker::drain_dead() {
  absl::Status why;
  {
    MutexLock lock(&mu_);
    why = dead_;
  }
  // Requests the kernel took still own their buffers: wait for them where the ring allows.
  while (in_kernel_ > 0) {
    io_uring_cqe* cqe = nullptr;
    const int ret = io_uring_wait_cqe(ring_.get(), &cqe);
    if (ret == -EINTR) continue;
    if (ret < 0) {
      for (uint32_t s = 0; s < slots_.size(); ++s) {
        if (state_[s] != SlotState::kInKernel) continue;
        Attempt a = std::move(slots_[s]);
        state_[s] = SlotState::kFree;
        a.complete_with(why, shared_.stats);
      }
      in_kernel_ = 0;
      break;
    }
    reap();
    run_completions();
    for (uint32_t s : ready_) {  // no resubmission on a dead ring
      Attempt a = std::move(slots_[s]);
      state_[s] = SlotState::kFree;
      a.complete_with(why, shared_.stats);
    }
    ready_.clear();
  }
  for (;;) {
    std::deque<Attempt> failed;
    {
      MutexLock lock(&mu_);
      while (pending_.empty() && !stopping_) strata::wait(&cv_, &mu_);
      if (pending_.empty()) return;
      failed.swap(pending_);
    }
    for (Attempt& a : failed) {
      shared_.stats.started();
      a.complete_with(why, shared_.stats);
    }
  }
}

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(std::unique_ptr<Shared> shared) : shared_(std::move(shared)) {}
  ~UringEngine() override {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    shared_->buffers.detach_all();  // waits for a registration in progress; no more after
    workers_.clear();               // each drains its queue and in-flight requests, then joins
  }

  absl::Status start(uint32_t depth, uint32_t workers) {
    for (uint32_t i = 0; i < workers; ++i) {
      absl::StatusOr<std::unique_ptr<Worker>> w = Worker::create(*shared_, i, depth, &warning_);
      if (!w.ok()) return w.status();
      workers_.push_back(*std::move(w));
    }
    return absl::OkStatus();
  }

  std::string_view name() const override { return "io_uring"; }
  // What start() found, else a registration failure since.
  std::string warning() const override {
    return warning_.empty() ? shared_->buffers.warning() : warning_;
  }

  absl::Status register_buffer(uint32_t index) override {
    return shared_->buffers.register_buffer(index);
  }

  absl::Status submit(std::span<IoRequest> requests) override {
    if (absl::Status s = io::validate(requests, shared_->files); !s.ok()) return s;
    const int64_t now = io::now_ns();
    MutexLock lock(&mu_);  // a batch goes in whole, or not at all once the engine stops
    if (stopping_) {
      return absl::FailedPreconditionError("io_uring engine: submit() after shutdown began");
    }
    const auto count = static_cast<uint32_t>(workers_.size());
    for (uint32_t i = 0; i < count; ++i) workers_[i]->enqueue(requests, i, count, now);
    return absl::OkStatus();
  }

  IoStats stats() const override {
    IoStats stats = shared_->stats.snapshot();
    shared_->buffers.add_stats(stats);
    return stats;
  }

 private:
  std::unique_ptr<Shared> shared_;  // outlives the workers (declared first)
  std::string warning_;             // written only before the engine is returned
  std::vector<std::unique_ptr<Worker>> workers_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> make_uring_engine(const IoEngineOptions& options) {
  if (absl::Status s = io::check_options("io_uring", options); !s.ok()) return s;
  const uint32_t workers = options.workers != 0
                               ? options.workers
                               : std::max<uint32_t>(1, static_cast<uint32_t>(options.files.size()));
  auto engine = std::make_unique<UringEngine>(std::make_unique<Shared>(options, workers));
  if (absl::Status s = engine->start(options.depth, workers); !s.ok()) return s;
  return engine;
}

}  // namespace strata
