// The machinery behind include/strata/strata.h: the exception boundary and the per-thread
// message, and the registry of live handles.
//
// Handles are ids, not addresses: strata_runtime_t* and friends carry a number that is never
// reused, looked up in one registry under a lock. A destroyed or made-up handle is therefore
// never dereferenced, and an old handle can never alias a newer object at the same address.
// Every call enters the lifetimes of the objects it uses; a destroy closes the lifetime first,
// which waits for calls in flight and lets no new one in.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>
#include <absl/synchronization/mutex.h>

#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/optimizer/offload_optimizer.h"
#include "strata/runtime/runtime.h"
#include "strata/store/tensor_store.h"
#include "strata/store/tier.h"
#include "strata/strata.h"

namespace strata::c_api {

// ---- Errors ------------------------------------------------------------------------------------

// Records "<function>: <message>" as the thread's last error and returns the status' code.
strata_status_t fail(absl::string_view function, const absl::Status& status) noexcept;

// Runs `body` (returning absl::Status) so that nothing thrown leaves through the C boundary.
template <typename Body>
strata_status_t boundary(absl::string_view function, Body&& body) noexcept {
  try {
    const absl::Status status = body();
    return status.ok() ? STRATA_OK : fail(function, status);
  } catch (const std::bad_alloc&) {
    return fail(function, absl::ResourceExhaustedError("out of host memory"));
  } catch (const std::exception& e) {
    return fail(function, absl::InternalError(e.what()));
  } catch (...) {
    return fail(function, absl::InternalError("an unknown exception"));
  }
}

absl::Status null_argument(absl::string_view param);
absl::StatusOr<TierKind> tier_from(strata_tier_t tier, absl::string_view param);
strata_tier_t tier_to_c(TierKind tier);
// Copies `text` into a caller's buffer as strata_runtime_describe() documents.
absl::Status copy_out(absl::string_view text, char* buffer, size_t size, size_t* length);

// ---- Lifetimes and the registry ----------------------------------------------------------------

class Lifetime {
 public:
  bool enter();  // false once closed
  void exit();
  // Lets no new call in and waits for those in flight; false when already closed.
  bool close();

 private:
  absl::Mutex mu_;
  absl::CondVar idle_;
  uint64_t active_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

enum class Kind { kRuntime, kStream, kOptimizer, kCommunicator, kZeroEngine };

// What strata_tensor_create_ex recorded; TensorStore keeps only bytes.
struct TensorMeta {
  uint32_t generation = 0;
  strata_dtype_t dtype = STRATA_DTYPE_UINT8;
  std::vector<int64_t> shape;
};

struct RuntimeState : std::enable_shared_from_this<RuntimeState> {
  uint64_t id = 0;
  Lifetime life;
  std::unique_ptr<Runtime> runtime;
  absl::Mutex mu;
  absl::flat_hash_map<uint32_t, TensorMeta> meta ABSL_GUARDED_BY(mu);  // by tensor index
  std::vector<uint64_t> children ABSL_GUARDED_BY(mu);                  // in creation order
};

// A stream, an optimizer, a communicator or a ZeRO engine: owned by one runtime, destroyed
// before it.
struct Child {
  virtual ~Child() = default;
  // Destroys the wrapped object now (a shared_ptr to the Child may outlive the runtime).
  virtual void destroy_payload() = 0;

  uint64_t id = 0;
  Kind kind = Kind::kStream;
  Lifetime life;
  std::shared_ptr<RuntimeState> owner;
};

struct StreamState final : Child {
  void destroy_payload() override { stream.reset(); }
  std::unique_ptr<Stream> stream;
};

struct Entry {
  Kind kind = Kind::kRuntime;
  std::shared_ptr<RuntimeState> runtime;  // kRuntime
  std::shared_ptr<Child> child;           // the other kinds
};

class Registry {
 public:
  static Registry& get();
  // Registers the entry under a new id, which it also stores in the entry's object.
  uint64_t add(Entry entry);
  // The live entry `id` of kind `kind`; `param` names it in errors.
  absl::StatusOr<Entry> find(uint64_t id, Kind kind, absl::string_view param) const;
  void remove(uint64_t id);
  // Removes and returns the entry, if it is still there.
  std::optional<Entry> take(uint64_t id);

 private:
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> live_ ABSL_GUARDED_BY(mu_);
};

template <typename T>
uint64_t id_of(T* handle) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
}
template <typename T>
T* handle_of(uint64_t id) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(id));
}

// One C call: the lifetimes it entered, left in reverse when it returns.
class Call {
 public:
  Call() = default;
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ~Call();

  absl::StatusOr<RuntimeState*> runtime(strata_runtime_t* handle, absl::string_view param);
  // The runtime a tensor handle belongs to (the store checks the rest of the handle).
  absl::StatusOr<RuntimeState*> runtime_of(const strata_tensor_t& tensor, absl::string_view param);
  // A child of kind `kind`, after entering its runtime.
  absl::StatusOr<Child*> child(uint64_t id, Kind kind, absl::string_view param);
  absl::StatusOr<StreamState*> stream(strata_stream_t* handle, absl::string_view param);

 private:
  absl::Status enter(std::shared_ptr<void> keep, Lifetime& life, absl::string_view param);
  std::vector<std::pair<std::shared_ptr<void>, Lifetime*>> entered_;
};

// Registers a new child of `runtime` (under its lock, so that its destroy sees the child) and
// returns the child's id.
uint64_t add_child(RuntimeState& runtime, Kind kind, std::shared_ptr<Child> child);

// strata_stream_destroy and strata_optimizer_destroy: closes the child (waiting for calls on it)
// and destroys what it wraps; the runtime cannot be destroyed meanwhile.
absl::Status destroy_child(uint64_t id, Kind kind, absl::string_view param);

inline TensorHandle to_handle(const strata_tensor_t& tensor) {
  return TensorHandle{tensor.index, tensor.generation};
}
inline strata_tensor_t to_c(const RuntimeState& runtime, TensorHandle handle) {
  return strata_tensor_t{runtime.id, handle.index, handle.generation};
}

// ---- Conversions shared by the optimizer and the ZeRO engine -----------------------------------
// `param` names the field in errors ("spec->param_type", "options->optimizer.isa").

absl::StatusOr<ParamType> param_type_from(strata_param_type_t type, absl::string_view param);
absl::StatusOr<GradType> grad_type_from(strata_grad_type_t type, absl::string_view param);
AdamGroup group_from(const strata_adam_group_t& group);
strata_adam_group_t group_to_c(const AdamGroup& group);
// `prefix` is prepended to the field names in errors: "options->", "options->optimizer.".
absl::StatusOr<OffloadOptimizerOptions> optimizer_options_from(const strata_optimizer_options_t& o,
                                                               absl::string_view prefix);
strata_optimizer_options_t optimizer_options_to_c(const OffloadOptimizerOptions& o);
strata_step_result_t step_result_to_c(const StepResult& result);

}  // namespace strata::c_api
