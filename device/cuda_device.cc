#include "cuda_device.h"

#include <absl/strings/str_format.h>
#include <cuda_runtime_api.h>

#include <utility>

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
  explicit CudaHostRegistration(void* data) : data_(data) {}
  ~CudaHostRegistration() override { cudaHostUnregister(data_); }

 private:
  void* const data_;
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
    return std::make_unique<CudaHostRegistration>(data);
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
    const cudaError_t error = cudaMemcpyAsync(dst, src, bytes, memcpy_kind(kind), s->handle);
    if (error == cudaSuccess) return absl::OkStatus();  // no text formatted per copy
    return cuda_status(
        error, absl::StrFormat("cudaMemcpyAsync(%s, %s)", to_string(kind), format_bytes(bytes)));
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
  absl::Status foreign(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("the %s was not created by CUDA device %d", what, ordinal_));
  }

  const int ordinal_;
  const GpuInfo info_;
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
