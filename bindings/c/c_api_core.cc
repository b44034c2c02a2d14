// The C API's error boundary, status names, dtypes and the handle registry.
#include <absl/strings/str_cat.h>

#include <cstring>

#include "c_api_internal.h"
#include "strata/base/mutex.h"

namespace strata::c_api {
namespace {

// absl's codes are the C API's, number for number.
static_assert(static_cast<int>(absl::StatusCode::kInvalidArgument) == STRATA_INVALID_ARGUMENT);
static_assert(static_cast<int>(absl::StatusCode::kNotFound) == STRATA_NOT_FOUND);
static_assert(static_cast<int>(absl::StatusCode::kFailedPrecondition) ==
              STRATA_FAILED_PRECONDITION);
static_assert(static_cast<int>(absl::StatusCode::kResourceExhausted) == STRATA_RESOURCE_EXHAUSTED);
static_assert(static_cast<int>(absl::StatusCode::kUnauthenticated) == STRATA_UNAUTHENTICATED);

// The message of the thread's last failure; `message` points into `text`, or at a constant
// when even the copy could not be made.
struct LastError {
  std::string text;
  const char* message = "";
};
thread_local LastError last_error;

absl::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kRuntime:
      return "a runtime";
    case Kind::kStream:
      return "a stream";
    case Kind::kOptimizer:
      return "an optimizer";
    case Kind::kCommunicator:
      return "a communicator";
    case Kind::kZeroEngine:
      return "a ZeRO engine";
  }
  return "an unknown object";
}

}  // namespace

strata_status_t fail(absl::string_view function, const absl::Status& status) noexcept {
  try {
    last_error.text = absl::StrCat(function, ": ", status.message());
    last_error.message = last_error.text.c_str();
  } catch (...) {
    last_error.message = "strata: out of host memory while recording an error message";
  }
  const auto code = static_cast<strata_status_t>(status.code());
  return code == STRATA_OK ? STRATA_UNKNOWN : code;
}

absl::Status null_argument(absl::string_view param) {
  return absl::InvalidArgumentError(absl::StrCat(param, " is NULL"));
}

strata_tier_t tier_to_c(TierKind tier) {
  switch (tier) {
    case TierKind::kGpu:
      return STRATA_TIER_GPU;
    case TierKind::kCpu:
      return STRATA_TIER_CPU;
    case TierKind::kNvme:
      return STRATA_TIER_NVME;
  }
  return STRATA_TIER_CPU;
}

absl::StatusOr<TierKind> tier_from(strata_tier_t tier, absl::string_view param) {
  switch (tier) {
    case STRATA_TIER_GPU:
      return TierKind::kGpu;
    case STRATA_TIER_CPU:
      return TierKind::kCpu;
    case STRATA_TIER_NVME:
      return TierKind::kNvme;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(param, " is ", tier,
                       ": use STRATA_TIER_GPU (0), STRATA_TIER_CPU (1) or STRATA_TIER_NVME (2)"));
  }
}

absl::Status copy_out(absl::string_view text, char* buffer, size_t size, size_t* length) {
  if (buffer == nullptr && size > 0) return null_argument("buffer (with size > 0)");
  if (length != nullptr) *length = text.size();
  if (size > 0) {
    const size_t n = std::min(text.size(), size - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return absl::OkStatus();
}

// ---- Lifetime -----------------------------------------------------------------------------------

bool Lifetime::enter() {
  MutexLock lock(&mu_);
  if (closed_) return false;
  ++active_;
  return true;
}

void Lifetime::exit() {
  MutexLock lock(&mu_);
  if (--active_ == 0) idle_.SignalAll();
}

bool Lifetime::close() {
  MutexLock lock(&mu_);
  if (closed_) return false;
  closed_ = true;
  while (active_ > 0) wait(&idle_, &mu_);
  return true;
}

// ---- Registry -----------------------------------------------------------------------------------

Registry& Registry::get() {
  // Never destroyed: runtimes left alive at exit may still have threads calling in.
  static Registry* const registry = new Registry;
  return *registry;
}

uint64_t Registry::add(Entry entry) {
  MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  // Set before the entry is visible: a lookup never sees an object without its id.
  if (entry.runtime != nullptr) entry.runtime->id = id;
  if (entry.child != nullptr) entry.child->id = id;
  live_.emplace(id, std::move(entry));
  return id;
}

absl::StatusOr<Entry> Registry::find(uint64_t id, Kind kind, absl::string_view param) const {
  MutexLock lock(&mu_);
  const auto it = live_.find(id);
  if (it == live_.end()) {
    if (id != 0 && id < next_id_) {
      return absl::NotFoundError(absl::StrCat(param, " was destroyed (", kind_name(kind),
                                              " handle used after its destroy)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(param, " is not ", kind_name(kind), " handle that strata returned"));
  }
  if (it->second.kind != kind) {
    return absl::InvalidArgumentError(absl::StrCat(param, " is ", kind_name(it->second.kind),
                                                   " handle, not ", kind_name(kind), " handle"));
  }
  return it->second;
}

void Registry::remove(uint64_t id) {
  MutexLock lock(&mu_);
  live_.erase(id);
}

std::optional<Entry> Registry::take(uint64_t id) {
  MutexLock lock(&mu_);
  const auto it = live_.find(id);
  if (it == live_.end()) return std::nullopt;
  Entry entry = std::move(it->second);
  live_.erase(it);
  return entry;
}

// ---- Call ---------------------------------------------------------------------------------------

Call::~Call() {
  for (auto it = entered_.rbegin(); it != entered_.rend(); ++it) it->second->exit();
}

absl::Status Call::enter(std::shared_ptr<void> keep, Lifetime& life, absl::string_view param) {
  for (const auto& [held, held_life] : entered_) {
    if (held_life == &life) return absl::OkStatus();  // a tensor and a stream of one runtime
  }
  if (!life.enter()) {
    return absl::NotFoundError(
        absl::StrCat(param, " was destroyed (handle used after its destroy)"));
  }
  entered_.emplace_back(std::move(keep), &life);
  return absl::OkStatus();
}

absl::StatusOr<RuntimeState*> Call::runtime(strata_runtime_t* handle, absl::string_view param) {
  if (handle == nullptr) return null_argument(param);
  auto entry = Registry::get().find(id_of(handle), Kind::kRuntime, param);
  if (!entry.ok()) return entry.status();
  RuntimeState* state = entry->runtime.get();
  if (auto status = enter(entry->runtime, state->life, param); !status.ok()) return status;
  return state;
}

absl::StatusOr<RuntimeState*> Call::runtime_of(const strata_tensor_t& tensor,
                                               absl::string_view param) {
  if (tensor.runtime == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(param, " is a null handle (zero-initialised, or from a failed create)"));
  }
  auto entry = Registry::get().find(tensor.runtime, Kind::kRuntime, param);
  if (!entry.ok()) {
    if (absl::IsNotFound(entry.status())) {
      return absl::NotFoundError(absl::StrCat(param, " belongs to a runtime that was destroyed"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(param, " is not a tensor handle strata returned"));
  }
  RuntimeState* state = entry->runtime.get();
  if (!enter(entry->runtime, state->life, param).ok()) {
    return absl::NotFoundError(absl::StrCat(param, " belongs to a runtime that was destroyed"));
  }
  return state;
}

absl::StatusOr<Child*> Call::child(uint64_t id, Kind kind, absl::string_view param) {
  if (id == 0) return null_argument(param);
  auto entry = Registry::get().find(id, kind, param);
  if (!entry.ok()) return entry.status();
  Child* child = entry->child.get();
  // The runtime first: its destroy closes it, then the children, with no call left inside.
  if (!enter(child->owner, child->owner->life, param).ok()) {
    return absl::NotFoundError(absl::StrCat(param, " belongs to a runtime that was destroyed"));
  }
  if (auto status = enter(entry->child, child->life, param); !status.ok()) return status;
  return child;
}

absl::StatusOr<StreamState*> Call::stream(strata_stream_t* handle, absl::string_view param) {
  auto child = this->child(id_of(handle), Kind::kStream, param);
  if (!child.ok()) return child.status();
  return static_cast<StreamState*>(*child);
}

uint64_t add_child(RuntimeState& runtime, Kind kind, std::shared_ptr<Child> child) {
  child->kind = kind;
  child->owner = runtime.shared_from_this();
  MutexLock lock(&runtime.mu);
  const uint64_t id = Registry::get().add(Entry{kind, nullptr, std::move(child)});
  runtime.children.push_back(id);
  return id;
}

absl::Status destroy_child(uint64_t id, Kind kind, absl::string_view param) {
  if (id == 0) return null_argument(param);
  auto entry = Registry::get().find(id, kind, param);
  if (!entry.ok()) return entry.status();
  Child& child = *entry->child;
  Call call;  // holds the runtime open, so its destroy does not race this one
  if (auto runtime = call.runtime(handle_of<strata_runtime_t>(child.owner->id), param);
      !runtime.ok()) {
    return absl::NotFoundError(absl::StrCat(param, " belongs to a runtime that was destroyed"));
  }
  if (!child.life.close()) {
    return absl::NotFoundError(absl::StrCat(param, " was destroyed (destroyed twice)"));
  }
  Registry::get().remove(id);
  {
    MutexLock lock(&child.owner->mu);
    std::erase(child.owner->children, id);
  }
  child.destroy_payload();
  return absl::OkStatus();
}

}  // namespace strata::c_api

extern "C" {

const char* strata_last_error(void) { return strata::c_api::last_error.message; }

const char* strata_status_name(strata_status_t status) {
  switch (status) {
    case STRATA_OK:
      return "OK";
    case STRATA_CANCELLED:
      return "CANCELLED";
    case STRATA_UNKNOWN:
      return "UNKNOWN";
    case STRATA_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case STRATA_DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case STRATA_NOT_FOUND:
      return "NOT_FOUND";
    case STRATA_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case STRATA_PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case STRATA_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case STRATA_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case STRATA_ABORTED:
      return "ABORTED";
    case STRATA_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case STRATA_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case STRATA_INTERNAL:
      return "INTERNAL";
    case STRATA_UNAVAILABLE:
      return "UNAVAILABLE";
    case STRATA_DATA_LOSS:
      return "DATA_LOSS";
    case STRATA_UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNRECOGNIZED";
  }
}

size_t strata_dtype_size(strata_dtype_t dtype) {
  switch (dtype) {
    case STRATA_DTYPE_UINT8:
    case STRATA_DTYPE_INT8:
    case STRATA_DTYPE_BOOL:
      return 1;
    case STRATA_DTYPE_INT16:
    case STRATA_DTYPE_UINT16:
    case STRATA_DTYPE_FLOAT16:
    case STRATA_DTYPE_BFLOAT16:
      return 2;
    case STRATA_DTYPE_INT32:
    case STRATA_DTYPE_UINT32:
    case STRATA_DTYPE_FLOAT32:
      return 4;
    case STRATA_DTYPE_INT64:
    case STRATA_DTYPE_UINT64:
    case STRATA_DTYPE_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

}  // extern "C"
