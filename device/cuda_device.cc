#include "cuda_device.h"

#include <absl/strings/str_format.h>
#include <cuda.h>  // the driver's types for cuStreamWaitValue32 (found at run time, not linked)
#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "host_ranges.h"
#include "strata/base/log.h"
#include "strata/base/mutex.h"
#include "strata/base/size.h"

namespace strata {
namespace {

absl::StatusCode code_for(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::StatusCode::kAlreadyExists;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status cuda_status(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::Status(code_for(error),
                      absl::StrFormat("%s failed: %s (%s)", what, cudaGetErrorString(error),
                                      cudaGetErrorName(error)));
}

cudaMemcpyKind memcpy_kind(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

// The CUDA runtime's current device is per thread; every entry point selects ours first. The
// error's text is formatted only on an error: this runs before every copy, event and query.
absl::Status select(int ordinal) {
  const cudaError_t error = cudaSetDevice(ordinal);
  if (error == cudaSuccess) return absl::OkStatus();
  return cuda_status(error, absl::StrFormat("cudaSetDevice(%d)", ordinal));
}

class CudaStream final : public Stream {
 public:
  // `owned`: strata created the stream and destroys it; wrapped external streams are not.
  CudaStream(int device, cudaStream_t stream, bool owned)
      : ordinal(device), handle(stream), owned_(owned) {}
  ~CudaStream() override {
    if (owned_ && select(ordinal).ok()) cudaStreamDestroy(handle);
  }
  const int ordinal;
  const cudaStream_t handle;

 private:
  const bool owned_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int device, cudaEvent_t event) : ordinal(device), handle(event) {}
  ~CudaEvent() override {
    if (select(ordinal).ok()) cudaEventDestroy(handle);
  }
  const int ordinal;
  const cudaEvent_t handle;
};

class CudaMemory final : public DeviceMemory {
 public:
  CudaMemory(int ordinal, void* data, uint64_t bytes)
      : DeviceMemory(data, bytes), ordinal_(ordinal) {}
  ~CudaMemory() override {
    if (select(ordinal_).ok()) cudaFree(data());
  }

 private:
  const int ordinal_;
};

class CudaHostRegistration final : public HostRegistration {
 public:
  CudaHostRegistration(std::shared_ptr<detail::RangeSet> registered, void* data)
      : registered_(std::move(registered)), data_(data) {}
  ~CudaHostRegistration() override {
    registered_->remove(data_);
    cudaHostUnregister(data_);
  }

 private:
  const std::shared_ptr<detail::RangeSet> registered_;
  void* const data_;
};

// cuStreamWaitValue32 from the driver the runtime loaded (no link to libcuda), or null where
// the driver has none.
using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
WaitValue32 wait_value_32() {
  static const WaitValue32 function = []() -> WaitValue32 {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t error = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &found, 12000,
                                                               cudaEnableDefault, &result);
#else
    const cudaError_t error =
        cudaGetDriverEntryPoint("cuStreamWaitValue32", &found, cudaEnableDefault, &result);
#endif
    if (error != cudaSuccess || result != cudaDriverEntryPointSuccess) return nullptr;
    return reinterpret_cast<WaitValue32>(found);
  }();
  return function;
}

// Host flags are words of mapped pinned memory that streams wait on (cuStreamWaitValue32, a
// cyclic greater-or-equal). A slot's word only grows: a flag waits for the slot's next value and
// is raised by storing it, so a wait an earlier, raised flag of the same slot left in a stream
// still passes, and a slot is reused at once. The words live as long as the device.
class FlagWords {
 public:
  struct Slot {
    std::atomic<uint32_t>* word = nullptr;
    CUdeviceptr device_word = 0;
  };

  ~FlagWords() {
    for (void* page : pages_) cudaFreeHost(page);
  }

  absl::StatusOr<uint32_t> take() {
    MutexLock lock(&mu_);
    if (free_.empty()) {
      void* page = nullptr;
      if (auto st = cuda_status(
              cudaHostAlloc(&page, kPageBytes, cudaHostAllocMapped | cudaHostAllocPortable),
              "cudaHostAlloc(host flags)");
          !st.ok()) {
        return st;
      }
      void* device = nullptr;
      if (auto st = cuda_status(cudaHostGetDevicePointer(&device, page, 0),
                                "cudaHostGetDevicePointer(host flags)");
          !st.ok()) {
        cudaFreeHost(page);
        return st;
      }
      pages_.push_back(page);
      auto* words = static_cast<std::atomic<uint32_t>*>(page);
      for (uint64_t i = 0; i < kPageBytes / sizeof(uint32_t); ++i) {
        new (&words[i]) std::atomic<uint32_t>(0);
        free_.push_back(static_cast<uint32_t>(slots_.size()));
        slots_.push_back(Slot{&words[i], reinterpret_cast<CUdeviceptr>(device) + i * 4});
      }
    }
    const uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  Slot slot(uint32_t index) {
    MutexLock lock(&mu_);
    return slots_[index];
  }
  void give_back(uint32_t index) {
    MutexLock lock(&mu_);
    free_.push_back(index);
  }

 private:
  static constexpr uint64_t kPageBytes = 4096;
  absl::Mutex mu_;
  std::vector<void*> pages_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
};

class CudaHostFlag final : public HostFlag {
 public:
  CudaHostFlag(std::shared_ptr<FlagWords> words, uint32_t index)
      : words_(std::move(words)),
        index_(index),
        slot_(words_->slot(index)),
        target_(slot_.word->load(std::memory_order_acquire) + 1) {}
  ~CudaHostFlag() override {
    raise();
    words_->give_back(index_);
  }
  void raise() {
    MutexLock lock(&mu_);
    slot_.word->store(target_, std::memory_order_release);
    raised_ = true;
    changed_.SignalAll();
  }
  // The host's wait, where the driver has no stream memory operations.
  void wait_raised() {
    MutexLock lock(&mu_);
    while (!raised_) strata::wait(&changed_, &mu_);
  }
  const FlagWords::Slot& slot() const { return slot_; }
  uint32_t target() const { return target_; }
  const FlagWords* words() const { return words_.get(); }

 private:
  const std::shared_ptr<FlagWords> words_;
  const uint32_t index_;
  const FlagWords::Slot slot_;
  const uint32_t target_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  bool raised_ ABSL_GUARDED_BY(mu_) = false;
};

void CUDART_CB run_host_callback(void* user_data) {
  std::unique_ptr<absl::AnyInvocable<void() &&>> callback(
      static_cast<absl::AnyInvocable<void() &&>*>(user_data));
  std::move (*callback)();
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, GpuInfo info) : ordinal_(ordinal), info_(std::move(info)) {}

  Backend backend() const override { return Backend::kCuda; }

  std::string description() const override {
    return absl::StrFormat("cuda:%d %s (sm_%d%d, %s)", ordinal_, info_.name, info_.cc_major,
                           info_.cc_minor, format_bytes(info_.total_bytes));
  }

  std::string pci_bus_id() const override {
    char id[32] = {};  // "dddd:bb:dd.f" and its terminator, with room to spare
    if (cudaDeviceGetPCIBusId(id, sizeof(id), ordinal_) != cudaSuccess) return {};
    return id;
  }

  int ordinal() const override { return ordinal_; }
  absl::Status make_current() override { return select(ordinal_); }

  absl::StatusOr<MemoryKind> memory_kind(const void* p) override {
    cudaPointerAttributes attributes{};
    if (auto status =
            cuda_status(cudaPointerGetAttributes(&attributes, p), "cudaPointerGetAttributes");
        !status.ok()) {
      return status;
    }
    switch (attributes.type) {
      case cudaMemoryTypeDevice:
      case cudaMemoryTypeManaged:
        return MemoryKind::kDevice;
      case cudaMemoryTypeHost:
        return MemoryKind::kRegisteredHost;
      default:
        return MemoryKind::kHost;
    }
  }

  absl::StatusOr<std::unique_ptr<DeviceMemory>> allocate_device_memory(uint64_t bytes) override {
    if (auto status = select(ordinal_); !status.ok()) return status;
    void* data = nullptr;
    if (auto status = cuda_status(
            cudaMalloc(&data, bytes),
            absl::StrFormat("cudaMalloc(%s) on cuda:%d", format_bytes(bytes), ordinal_));
        !status.ok()) {
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      return absl::Status(
          status.code(),
          absl::StrFormat("%s; %s of %s free: lower STRATA_GPU_BYTES", status.message(),
                          format_bytes(free_bytes), format_bytes(total_bytes)));
    }
    return std::make_unique<CudaMemory>(ordinal_, data, bytes);
  }

  absl::StatusOr<std::unique_ptr<HostRegistration>> register_host(void* data,
                                                                  uint64_t bytes) override {
    if (auto status = select(ordinal_); !status.ok()) return status;
    if (auto status = cuda_status(cudaHostRegister(data, bytes, cudaHostRegisterDefault),
                                  absl::StrFormat("cudaHostRegister(%s)", format_bytes(bytes)));
        !status.ok()) {
      return status;
    }
    if (auto status = registered_->add(data, bytes, "cudaHostRegister"); !status.ok()) {
      cudaHostUnregister(data);  // CUDA refuses overlapping registrations first; not expected
      return status;
    }
    return std::make_unique<CudaHostRegistration>(registered_, data);
  }

  absl::StatusOr<std::unique_ptr<Stream>> create_stream() override {
    if (auto status = select(ordinal_); !status.ok()) return status;
    cudaStream_t stream = nullptr;
    if (auto status = cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags");
        !status.ok()) {
      return status;
    }
    return std::make_unique<CudaStream>(ordinal_, stream, /*owned=*/true);
  }

  // The handle is taken as given: CUDA checks it when it is used (cudaErrorInvalidResourceHandle
  // becomes InvalidArgument). 0, cudaStreamLegacy and cudaStreamPerThread are valid handles.
  absl::StatusOr<std::unique_ptr<Stream>> wrap_external_stream(uintptr_t native) override {
    return std::make_unique<CudaStream>(ordinal_, reinterpret_cast<cudaStream_t>(native),
                                        /*owned=*/false);
  }

  absl::StatusOr<uintptr_t> native_handle(Stream& stream) override {
    auto* s = own(stream);
    if (s == nullptr) return foreign("stream");
    return reinterpret_cast<uintptr_t>(s->handle);
  }

  absl::StatusOr<std::unique_ptr<Event>> create_event() override {
    if (auto status = select(ordinal_); !status.ok()) return status;
    cudaEvent_t event = nullptr;
    if (auto status = cuda_status(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags");
        !status.ok()) {
      return status;
    }
    return std::make_unique<CudaEvent>(ordinal_, event);
  }

  absl::Status copy_async(void* dst, const void* src, uint64_t bytes, CopyKind kind,
                          Stream& stream) override {
    auto* s = own(stream);
    if (s == nullptr) return foreign("stream");
    if (bytes == 0) return absl::OkStatus();
    if (kind == CopyKind::kDeviceToDevice) {
      const auto d = reinterpret_cast<uintptr_t>(dst);
      const auto r = reinterpret_cast<uintptr_t>(src);
      if (d < r + bytes && r < d + bytes) {
        return absl::InvalidArgumentError(
            "device-to-device copy between overlapping ranges; copy in steps no larger than "
            "the distance between them");
      }
    }
    if (auto status = select(ordinal_); !status.ok()) return status;
    // CUDA copies within one registration, or within memory not registered at all: a host range
    // spanning several pieces of the pinned CPU tier (registered piece by piece as it fills) is
    // copied one piece at a time, in stream order. Memory strata did not register (a framework's
    // cudaHostAlloc buffer, pageable memory) is one piece, passed through as it is.
    const void* host = kind == CopyKind::kDeviceToHost ? dst : src;
    std::vector<detail::RangeSet::Segment> pieces;
    if (kind != CopyKind::kDeviceToDevice) pieces = registered_->segments(host, bytes);
    if (pieces.size() <= 1) {
      const cudaError_t error = cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), s->handle);
      if (error == cudaSuccess) return absl::OkStatus();  // no text formatted per copy
      return cuda_status(
          error, absl::StrFormat("cudaMemcpyAsync(%s, %s)", to_string(kind), format_bytes(bytes)));
    }
    for (const detail::RangeSet::Segment& piece : pieces) {
      const auto at = static_cast<uint64_t>(piece.data - static_cast<const std::byte*>(host));
      const cudaError_t error = cudaMemcpyAsync(static_cast<std::byte*>(dst) + at,
                                                static_cast<const std::byte*>(src) + at,
                                                piece.bytes, memcpy_kind(kind), s->handle);
      if (error == cudaSuccess) continue;
      return cuda_status(error, absl::StrFormat("cudaMemcpyAsync(%s, %s of %s)", to_string(kind),
                                                format_bytes(piece.bytes), format_bytes(bytes)));
    }
    return absl::OkStatus();
  }

  absl::Status launch_host_callback(Stream& stream,
                                    absl::AnyInvocable<void() &&> callback) override {
    auto* s = own(stream);
    if (s == nullptr) return foreign("stream");
    if (!callback) return absl::InvalidArgumentError("launch_host_callback: empty callback");
    if (auto status = select(ordinal_); !status.ok()) return status;
    auto owned = std::make_unique<absl::AnyInvocable<void() &&>>(std::move(callback));
    if (auto status = cuda_status(cudaLaunchHostFunc(s->handle, run_host_callback, owned.get()),
                                  "cudaLaunchHostFunc");
        !status.ok()) {
      return status;
    }
    owned.release();  // run_host_callback owns it now
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<HostFlag>> create_host_flag() override {
    if (auto status = select(ordinal_); !status.ok()) return status;
    auto index = flag_words_->take();
    if (!index.ok()) return index.status();
    return std::make_unique<CudaHostFlag>(flag_words_, *index);
  }

  absl::Status raise_host_flag(HostFlag& flag) override {
    auto* f = own(flag);
    if (f == nullptr) return foreign("host flag");
    f->raise();
    return absl::OkStatus();
  }

  absl::Status wait_host_flag(Stream& stream, HostFlag& flag) override {
    auto* f = own(flag);
    auto* s = own(stream);
    if (f == nullptr) return foreign("host flag");
    if (s == nullptr) return foreign("stream");
    if (auto status = select(ordinal_); !status.ok()) return status;
    WaitValue32 wait_value = stream_waits_ ? wait_value_32() : nullptr;
    if (wait_value != nullptr) {
      const CUresult result =
          wait_value(reinterpret_cast<CUstream>(s->handle), f->slot().device_word, f->target(),
                     CU_STREAM_WAIT_VALUE_GEQ);
      if (result == CUDA_SUCCESS) return absl::OkStatus();
      if (result != CUDA_ERROR_NOT_SUPPORTED) {
        return absl::InternalError(
            absl::StrFormat("cuStreamWaitValue32 on cuda:%d failed: CUresult %d", ordinal_,
                            static_cast<int>(result)));
      }
    }
    if (stream_waits_.exchange(false)) {
      log::warn_once(absl::StrFormat(
          "cuda:%d: the driver offers no stream memory operations (cuStreamWaitValue32): work "
          "ordered after the host (a Gloo collective) waits on the host instead of on the stream",
          ordinal_));
    }
    f->wait_raised();
    return absl::OkStatus();
  }

  absl::Status record(Event& event, Stream& stream) override {
    auto* e = own(event);
    auto* s = own(stream);
    if (e == nullptr) return foreign("event");
    if (s == nullptr) return foreign("stream");
    if (auto status = select(ordinal_); !status.ok()) return status;
    return cuda_status(cudaEventRecord(e->handle, s->handle), "cudaEventRecord");
  }

  absl::Status wait(Stream& stream, Event& event) override {
    auto* e = own(event);
    auto* s = own(stream);
    if (e == nullptr) return foreign("event");
    if (s == nullptr) return foreign("stream");
    if (auto status = select(ordinal_); !status.ok()) return status;
    return cuda_status(cudaStreamWaitEvent(s->handle, e->handle, 0), "cudaStreamWaitEvent");
  }

  absl::StatusOr<bool> query(Event& event) override {
    auto* e = own(event);
    if (e == nullptr) return foreign("event");
    if (auto status = select(ordinal_); !status.ok()) return status;
    const cudaError_t result = cudaEventQuery(e->handle);
    if (result == cudaErrorNotReady) return false;
    if (auto status = cuda_status(result, "cudaEventQuery"); !status.ok()) return status;
    return true;
  }

  absl::Status synchronize(Event& event) override {
    auto* e = own(event);
    if (e == nullptr) return foreign("event");
    if (auto status = select(ordinal_); !status.ok()) return status;
    return cuda_status(cudaEventSynchronize(e->handle), "cudaEventSynchronize");
  }

  absl::Status synchronize(Stream& stream) override {
    auto* s = own(stream);
    if (s == nullptr) return foreign("stream");
    if (auto status = select(ordinal_); !status.ok()) return status;
    return cuda_status(cudaStreamSynchronize(s->handle), "cudaStreamSynchronize");
  }

 private:
  CudaStream* own(Stream& stream) const {
    auto* s = dynamic_cast<CudaStream*>(&stream);
    return s != nullptr && s->ordinal == ordinal_ ? s : nullptr;
  }
  CudaEvent* own(Event& event) const {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    return e != nullptr && e->ordinal == ordinal_ ? e : nullptr;
  }
  CudaHostFlag* own(HostFlag& flag) const {
    auto* f = dynamic_cast<CudaHostFlag*>(&flag);
    return f != nullptr && f->words() == flag_words_.get() ? f : nullptr;
  }
  absl::Status foreign(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("the %s was not created by CUDA device %d", what, ordinal_));
  }

  const int ordinal_;
  const GpuInfo info_;
  // Host ranges registered through register_host, to cut copies at their edges. Shared with the
  // registrations, which may outlive the device.
  const std::shared_ptr<detail::RangeSet> registered_ = std::make_shared<detail::RangeSet>();
  const std::shared_ptr<FlagWords> flag_words_ = std::make_shared<FlagWords>();
  std::atomic<bool> stream_waits_{true};  // false once the driver said it cannot
};

}  // namespace

absl::StatusOr<int> cuda_device_count() {
  int count = 0;
  if (auto status = cuda_status(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !status.ok()) {
    return status;
  }
  return count;
}

absl::StatusOr<GpuInfo> cuda_device_info(int ordinal) {
  if (auto status = select(ordinal); !status.ok()) return status;
  cudaDeviceProp properties{};
  if (auto status =
          cuda_status(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties");
      !status.ok()) {
    return status;
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (auto status = cuda_status(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      !status.ok()) {
    return status;
  }
  GpuInfo info;
  info.ordinal = ordinal;
  info.name = properties.name;
  info.total_bytes = total_bytes;
  info.free_bytes = free_bytes;
  info.cc_major = properties.major;
  info.cc_minor = properties.minor;
  return info;
}

absl::StatusOr<std::unique_ptr<Device>> make_cuda_device(int ordinal) {
  auto info = cuda_device_info(ordinal);
  if (!info.ok()) return info.status();
  return std::make_unique<CudaDevice>(ordinal, *std::move(info));
}

}  // namespace strata
