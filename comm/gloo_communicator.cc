#include "gloo_communicator.h"

#include <absl/time/time.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "collective_call.h"
#include "communicator_base.h"
#include "host_reduce.h"
#include "job_monitor.h"
#include "ordered_executor.h"
#include "strata/base/log.h"
#include "strata/base/text.h"
#include "strata/device/device.h"

namespace strata::comm_internal {
namespace {

using text::cat;
using text::to_absl;

// Gloo's rendezvous reads and writes through this; failures become Gloo exceptions (which
// connectFullMesh expects) and the store's own status is kept for the user's message.
class StoreForGloo final : public gloo::rendezvous::Store {
 public:
  explicit StoreForGloo(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    check(store_.set(key, std::string_view(data.data(), data.size())));
  }
  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> value = store_.get(key);
    check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.options().timeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    check(store_.wait(keys, t));
  }
  const absl::Status& error() const { return error_; }

 private:
  void check(const absl::Status& status) {
    if (status.ok()) return;
    error_ = status;
    throw gloo::IoException(std::string(status.message()));
  }
  TcpStore& store_;
  absl::Status error_;
};

class GlooWork final : public CollectiveWork {
 public:
  GlooWork(std::shared_ptr<OrderedExecutor> executor,
           std::shared_ptr<OrderedExecutor::Ticket> ticket, uint64_t sequence,
           std::chrono::milliseconds timeout)
      : executor_(std::move(executor)),
        ticket_(std::move(ticket)),
        sequence_(sequence),
        timeout_(timeout) {}

  absl::Status wait() override {
    // Gloo bounds every operation by the timeout; this backstop (twice that, plus the
    // post-mortem) only guards against an engine that never returns.
    const absl::Status status =
        executor_->wait(ticket_, absl::FromChrono(timeout_) * 2 + absl::Seconds(5));
    if (status.code() == absl::StatusCode::kDeadlineExceeded && status.message() == "timed out") {
      return absl::DeadlineExceededError(to_absl(
          cat("collective #", sequence_,
              " did not finish within twice STRATA_COMM_TIMEOUT: the engine is stuck; stop the "
              "job")));
    }
    return status;
  }
  absl::Status synchronize() override { return wait(); }
  uint64_t sequence() const override { return sequence_; }

 private:
  std::shared_ptr<OrderedExecutor> executor_;
  std::shared_ptr<OrderedExecutor::Ticket> ticket_;
  uint64_t sequence_;
  std::chrono::milliseconds timeout_;
};

// Gloo's halving-doubling reduce-scatter is templated on the element type and takes a typed
// reduction; these forward to host_reduce's combine functions.
template <typename T, ReduceOp Op>
void typed_combine(T* x, const T* y, size_t n);

template <typename T>
constexpr DataType data_type_of();
template <>
constexpr DataType data_type_of<uint8_t>() {
  return DataType::kUInt8;
}
template <>
constexpr DataType data_type_of<int32_t>() {
  return DataType::kInt32;
}
template <>
constexpr DataType data_type_of<int64_t>() {
  return DataType::kInt64;
}
template <>
constexpr DataType data_type_of<Float16Bits>() {
  return DataType::kFloat16;
}
template <>
constexpr DataType data_type_of<BFloat16Bits>() {
  return DataType::kBFloat16;
}
template <>
constexpr DataType data_type_of<float>() {
  return DataType::kFloat32;
}
template <>
constexpr DataType data_type_of<double>() {
  return DataType::kFloat64;
}

template <typename T, ReduceOp Op>
void typed_combine(T* x, const T* y, size_t n) {
  static const CombineFn fn = combine_function(data_type_of<T>(), Op);
  fn(x, y, n);
}

template <typename T>
const gloo::ReductionFunction<T>* gloo_reduction(ReduceOp op) {
  static const gloo::ReductionFunction<T> sum(gloo::SUM, &typed_combine<T, ReduceOp::kSum>);
  static const gloo::ReductionFunction<T> max(gloo::MAX, &typed_combine<T, ReduceOp::kMax>);
  static const gloo::ReductionFunction<T> min(gloo::MIN, &typed_combine<T, ReduceOp::kMin>);
  switch (op) {
    case ReduceOp::kMax:
      return &max;
    case ReduceOp::kMin:
      return &min;
    default:
      return &sum;
  }
}

// Calls f(T{}) with the storage type of `type` (Gloo's algorithms are templated on it).
template <typename F>
void with_storage_type(DataType type, F&& f) {
  switch (type) {
    case DataType::kUInt8:
      return f(uint8_t{});
    case DataType::kInt32:
      return f(int32_t{});
    case DataType::kInt64:
      return f(int64_t{});
    case DataType::kFloat16:
      return f(Float16Bits{});
    case DataType::kBFloat16:
      return f(BFloat16Bits{});
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
  }
}

// 4 MiB: below where Gloo's halving-doubling reduce-scatter collapsed on loopback.
constexpr uint64_t kReduceScatterPieceBytes = uint64_t{4} << 20;

#if defined(STRATA_TSAN)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

// A Gloo exception's message, written by one of Gloo's threads and handed over under Gloo's own
// locks, which TSan cannot see: its read is hidden from TSan (TSan builds only).
std::string message_of(const std::exception& e) {
#if defined(STRATA_TSAN)
  __tsan_ignore_thread_begin();
  std::string text = e.what();
  __tsan_ignore_thread_end();
  return text;
#else
  return e.what();
#endif
}

class GlooCommunicator final : public CommunicatorBase {
 public:
  GlooCommunicator(const CommOptions& options, std::unique_ptr<JobMonitor> monitor,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : CommunicatorBase(options, std::move(monitor)),
        context_(std::move(context)),
        executor_(std::make_shared<OrderedExecutor>()) {}

  ~GlooCommunicator() override {
    // Runs what was issued (each bounded by the timeout): the tasks use this communicator, and
    // work handles may keep the executor itself alive past it.
    executor_->drain();
    context_.reset();  // close Gloo's pairs before the job's rendezvous goes (the base's)
  }

  CommBackendKind backend() const override { return CommBackendKind::kGloo; }

 protected:
  std::string engine() const override { return "gloo"; }

  absl::Status check_options(const CollectiveOptions& options) override {
    if (options.stream != nullptr && this->options().device == nullptr) {
      return absl::InvalidArgumentError(
          "a collective was given a stream but the communicator has no device: pass "
          "CommOptions::device (or the device to Communicator::from_environment)");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<CollectiveWork>> start(const Operation& op,
                                                        const CollectiveOptions& options) override {
    auto task = std::make_shared<Task>(Task{op, nullptr});
    if (options.stream != nullptr) {
      Device& device = *this->options().device;
      absl::StatusOr<std::unique_ptr<Event>> event = device.create_event();
      absl::Status recorded = event.ok() ? device.record(**event, *options.stream) : event.status();
      if (!recorded.ok()) return fail(op.call, text::to_std(recorded.message()));
      task->ready = *std::move(event);
    }
    std::shared_ptr<OrderedExecutor::Ticket> ticket =
        executor_->submit([this, task] { return run(*task); });
    return std::make_unique<GlooWork>(executor_, std::move(ticket), op.call.sequence,
                                      settings().timeout);
  }

  // Every rank gathers every rank's signature of this call.
  absl::StatusOr<std::vector<CollectiveCall::Signature>> exchange_signatures(
      const CollectiveCall& call, const CollectiveOptions&) override {
    const CollectiveCall::Signature mine = call.signature();
    std::vector<CollectiveCall::Signature> all(size());
    try {
      gloo::AllgathervOptions opts(context_);
      opts.setInput(const_cast<uint64_t*>(mine.data()), mine.size());
      opts.setOutput(all.front().data(), std::vector<size_t>(size(), mine.size()));
      opts.setTag(tag(call) + 1);
      gloo::allgatherv(opts);
    } catch (const std::exception& e) {
      return absl::UnavailableError(to_absl(message_of(e)));
    }
    return all;
  }

  void abort_transport() override {}  // Gloo's calls end by themselves (bounded by the timeout)
  void on_broken(const absl::Status&) override {}  // each queued task checks health() first

  // A group's own Gloo context: its pairs connect through the group's rendezvous.
  absl::StatusOr<std::unique_ptr<Communicator>> create_split(const CommOptions& options,
                                                             std::unique_ptr<JobMonitor> monitor,
                                                             int, int) override {
    return create_gloo_communicator(options, std::move(monitor));
  }

 private:
  struct Task {
    Operation op;
    std::unique_ptr<Event> ready;  // recorded on CollectiveOptions::stream at issue
  };

  // Data and signature exchanges get distinct tags, so a late one never matches the other.
  static uint32_t tag(const CollectiveCall& call) {
    return static_cast<uint32_t>(call.sequence * 2);
  }

  absl::Status run(Task& task) {
    if (health()->failing()) return broken_error();
    const CollectiveCall& call = task.op.call;
    if (task.ready != nullptr) {
      if (absl::Status s = options().device->synchronize(*task.ready); !s.ok()) {
        return fail(call, text::to_std(s.message()));
      }
    }
    if (settings().debug) {
      if (absl::Status s = check_signatures(call, {}); !s.ok()) return s;
    }
    if (call.kind != CollectiveKind::kBarrier && call.total_count() == 0) return absl::OkStatus();
    try {
      transport(task.op);
    } catch (const std::exception& e) {
      return fail(call, message_of(e));
    }
    return absl::OkStatus();
  }

  // Which of Gloo's algorithms runs each call: comm/gloo_peers.cc (the post-mortem's peers)
  // follows this choice.
  void transport(const Operation& op) {
    const CollectiveCall& c = op.call;
    switch (c.kind) {
      case CollectiveKind::kAllGather:
        return all_gather_bytes(c, op.send, op.recv);
      case CollectiveKind::kReduceScatter:
        reduce_scatter_in_pieces(c, static_cast<const uint8_t*>(op.send),
                                 static_cast<uint8_t*>(op.recv));
        if (c.op == ReduceOp::kAverage) divide_in_place(op.recv, c.counts[rank()], c.type, size());
        return;
      case CollectiveKind::kAllReduce:
        if (op.send != op.recv) std::memcpy(op.recv, op.send, c.total_bytes());
        all_reduce_in_place(c, op.recv, c.total_count(), c.op);
        if (c.op == ReduceOp::kAverage) divide_in_place(op.recv, c.total_count(), c.type, size());
        return;
      case CollectiveKind::kBroadcast: {
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(static_cast<uint8_t*>(op.recv), c.total_bytes());
        opts.setRoot(c.root);
        opts.setTag(tag(c));
        return gloo::broadcast(opts);
      }
      case CollectiveKind::kBarrier: {
        gloo::BarrierOptions opts(context_);
        opts.setTag(tag(c));
        return gloo::barrier(opts);
      }
    }
  }

  // Gathering moves bytes only: byte counts, one code path for every type.
  void all_gather_bytes(const CollectiveCall& c, const void* send, void* recv) {
    const size_t element = element_size(c.type);
    std::vector<size_t> byte_counts;
    for (uint64_t count : c.counts) byte_counts.push_back(count * element);
    const uint64_t offset =
        std::accumulate(c.counts.begin(), c.counts.begin() + rank(), uint64_t{0});
    uint8_t* own = static_cast<uint8_t*>(recv) + offset * element;
    gloo::AllgathervOptions opts(context_);
    if (send != own) {
      opts.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), byte_counts[rank()]);
    }
    opts.setOutput(static_cast<uint8_t*>(recv), std::move(byte_counts));
    opts.setTag(tag(c));
    gloo::allgatherv(opts);
  }

  // gloo::allreduce of `count` elements at `data` with strata's element-wise reduction `op`
  // (average: the sum, divided by the caller).
  void all_reduce_in_place(const CollectiveCall& c, void* data, uint64_t count, ReduceOp op) {
    const size_t element = element_size(c.type);
    const CombineFn combine =
        combine_function(c.type, op == ReduceOp::kAverage ? ReduceOp::kSum : op);
    with_storage_type(c.type, [&](auto zero) {
      using T = decltype(zero);
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(static_cast<T*>(data), count);
      // x = a op b over n elements (x may be a).
      opts.setReduceFunction([combine, element](void* x, const void* a, const void* b, size_t n) {
        if (x != a) std::memcpy(x, a, n * element);
        combine(x, b, n);
      });
      opts.setTag(tag(c));
      gloo::allreduce(opts);
    });
  }

  // Gloo's halving-doubling reduce-scatter reduces in the buffer it is given and leaves this
  // rank's slice at its start. Above a few MiB per call it collapses here (12 MiB: 40× slower
  // than 10 MiB, for Gloo called directly too — docs/comm.md), so a large call runs as pieces
  // of at most kReduceScatterPieceBytes: piece j takes the j-th part of every rank's slice,
  // packed into a scratch buffer (which also keeps `send` intact out of place). A small call
  // made in place runs on the caller's buffer directly.
  void reduce_scatter_in_pieces(const CollectiveCall& c, const uint8_t* send, uint8_t* recv) {
    const uint64_t element = element_size(c.type);
    const int world = size();
    std::vector<uint64_t> offsets(world + 1, 0);
    for (int r = 0; r < world; ++r) offsets[r + 1] = offsets[r] + c.counts[r];
    const uint64_t total = offsets[world];
    const uint64_t mine = c.counts[rank()];
    const uint64_t pieces = std::max<uint64_t>(
        1, (total * element + kReduceScatterPieceBytes - 1) / kReduceScatterPieceBytes);
    const bool in_place = recv == send + offsets[rank()] * element;
    const auto run_piece = [&](void* buffer, const std::vector<int>& counts) {
      with_storage_type(c.type, [&](auto zero) {
        using T = decltype(zero);
        const int count = std::accumulate(counts.begin(), counts.end(), 0);
        gloo::ReduceScatterHalvingDoubling<T> algorithm(context_, {static_cast<T*>(buffer)}, count,
                                                        counts, gloo_reduction<T>(c.op));
        algorithm.run();
      });
    };
    if ((world & (world - 1)) != 0) {
      // Not a power of two: Gloo's halving-doubling splits the ranks into binary blocks, and its
      // exchange between blocks lost a rank's contribution now and then under ZeRO stage 3's
      // interleaved traffic (a 3-rank test: the larger block summed zeros for rank 2's part).
      // An all-reduce of the whole buffer (Gloo's ring, new API) is correct at twice the bytes.
      uint8_t* buffer = const_cast<uint8_t*>(send);
      if (!in_place) {
        scratch_.assign(send, send + total * element);
        buffer = scratch_.data();
      }
      all_reduce_in_place(c, buffer, total, c.op);
      uint8_t* own = buffer + offsets[rank()] * element;
      if (mine > 0 && own != recv) std::memmove(recv, own, mine * element);
      return;
    }
    const bool any_empty =
        std::any_of(c.counts.begin(), c.counts.end(), [](uint64_t n) { return n == 0; });
    if (pieces == 1 && in_place && !any_empty) {
      uint8_t* buffer = const_cast<uint8_t*>(send);
      run_piece(buffer, std::vector<int>(c.counts.begin(), c.counts.end()));
      if (mine > 0 && buffer != recv) std::memmove(recv, buffer, mine * element);
      return;
    }
    std::vector<uint64_t> per_piece(world);
    uint64_t piece_total = 0;
    for (int r = 0; r < world; ++r) {
      per_piece[r] = (c.counts[r] + pieces - 1) / pieces;
      piece_total += std::max<uint64_t>(per_piece[r], 1);
    }
    scratch_.resize(piece_total * element);
    std::vector<int> part(world);
    for (uint64_t j = 0; j < pieces; ++j) {
      uint8_t* packed = scratch_.data();
      bool any_data = false;
      for (int r = 0; r < world; ++r) {
        const uint64_t start = std::min(c.counts[r], j * per_piece[r]);
        const uint64_t n = std::min(c.counts[r] - start, per_piece[r]);
        any_data |= n > 0;
        if (n > 0) {
          std::memcpy(packed, send + (offsets[r] + start) * element, n * element);
        } else {
          // Gloo's algorithm can hang when a rank's part is empty (seen with 3 ranks): such a
          // rank gets one zero element whose reduction nobody reads.
          std::memset(packed, 0, element);
        }
        part[r] = static_cast<int>(std::max<uint64_t>(n, 1));
        packed += part[r] * element;
      }
      // Every rank computes the same parts, so an empty piece is skipped everywhere.
      if (!any_data) continue;
      run_piece(scratch_.data(), part);
      // In place this writes only the part of this rank's slice already packed above.
      const uint64_t own_start = std::min(mine, j * per_piece[rank()]);
      const uint64_t own = std::min(mine - own_start, per_piece[rank()]);
      if (own > 0)
        std::memcpy(recv + j * per_piece[rank()] * element, scratch_.data(), own * element);
    }
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::shared_ptr<OrderedExecutor> executor_;  // shared with the works it hands out
  std::vector<uint8_t> scratch_;               // reduce-scatter pieces; used by one task at a time
};

// Gloo's TCP transport writes to its sockets without MSG_NOSIGNAL: once a peer rank has died, a
// write that meets its reset connection raises SIGPIPE, whose default action kills this process
// too (seen in CI: the surviving ranks of a job died of signal 13 instead of reporting the dead
// one). With SIGPIPE handled the write fails with EPIPE, Gloo throws, and the survivors fail
// with the Communicator's error. Installed once, and only over the default disposition: a
// handler (or SIG_IGN) the program chose stays. A do-nothing handler rather than SIG_IGN, so
// that programs this process execs start with the default again.
void handle_sigpipe_once() {
  static const bool installed = [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
        (current.sa_flags & SA_SIGINFO) != 0) {
      return false;
    }
    struct sigaction quiet {};
    quiet.sa_handler = [](int) {};
    sigemptyset(&quiet.sa_mask);
    quiet.sa_flags = SA_RESTART;
    if (sigaction(SIGPIPE, &quiet, nullptr) != 0) return false;
    STRATA_LOG(kDebug, "%s",
               "SIGPIPE is handled: a dead peer's socket fails Gloo's write "
               "instead of killing this process");
    return true;
  }();
  (void)installed;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> create_gloo_communicator(
    const CommOptions& options, std::unique_ptr<JobMonitor> monitor) {
  handle_sigpipe_once();
  const LaunchInfo& launch = options.launch;
  auto context = std::make_shared<gloo::rendezvous::Context>(launch.rank, launch.world_size);
  context->setTimeout(options.settings.timeout);
  StoreForGloo store(monitor->store());
  try {
    gloo::transport::tcp::attr attr;
    // The interface that reaches rank 0 reaches the other ranks too.
    attr.hostname = monitor->store().local_address();
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::PrefixStore prefixed("strata/gloo", store);
    context->connectFullMesh(prefixed, device);
  } catch (const std::exception& e) {
    const std::string cause = store.error().ok() ? e.what() : std::string(store.error().message());
    return absl::UnavailableError(
        to_absl(cat("rank ", launch.rank, " of ", launch.world_size,
                    " could not connect Gloo's pairs "
                    "(rendezvous at ",
                    launch.master_addr, ":", launch.master_port, "): ", cause)));
  }
  return std::make_unique<GlooCommunicator>(options, std::move(monitor), std::move(context));
}

}  // namespace strata::comm_internal

// ThreadSanitizer builds only: Gloo is not built with TSan, so TSan sees none of its locks. It
// then reports Gloo's own threads as racing: its halving-doubling reduce-scatter sends from and
// receives into one notification byte (recv and writev called from libgloo), and a pair's stored
// exception (a peer that left first) is freed by the thread that closes the context, and an
// exception a Gloo thread allocated is rethrown to (and read by) the collective's thread. Reports
// with a libgloo frame, on an exception object, or in Gloo's context teardown, are suppressed;
// strata's own accesses stay checked. TSan reads this hook at start (a program that defines its own
// replaces it); it lives here so it is linked whenever the Gloo backend is.
#if defined(STRATA_TSAN)
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libgloo.so\nrace:libgloo.so\nrace:gloo::Exception\n"
         "race:gloo::rendezvous::Context\nrace:__cxa_allocate_exception\n";
}
#endif

// AddressSanitizer builds only: the distribution step of Gloo's halving-doubling reduce-scatter
// (gloo/reduce_scatter.h, compiled into strata from Debian's header) memcpy's a rank's result
// onto an overlapping range of the same buffer; glibc's memcpy on x86-64 is memmove, so the
// result is right, but the interceptor reports it. That one call site is suppressed.
#if defined(__SANITIZE_ADDRESS__)
extern "C" const char* __asan_default_suppressions() {
  return "interceptor_via_fun:gloo::ReduceScatterHalvingDoubling\n";
}
#endif
