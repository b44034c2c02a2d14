// NCCL, found and loaded at run time, never linked: one build of strata serves machines with and
// without it, and the 200 MB library is never carried. The search (once per process, on first
// need; thread-safe), each step reported:
//   1. STRATA_NCCL_LIBRARY: a path to libnccl.so.2. Set but unloadable (or not NCCL, or too old)
//      is an error naming it: nothing else is tried.
//   2. NCCL already loaded in this process (torch's, when torch was imported first).
//   3. The directories in STRATA_NCCL_SEARCH_PATH (colon-separated; the Python package puts the
//      nvidia-nccl wheel's lib/ directories there).
//   4. The system: dlopen("libnccl.so.2") (LD_LIBRARY_PATH, ld.so.cache), then
//      /usr/local/cuda/lib64.
// The version comes from ncclGetVersion. In steps 2-4 a library older than kMinNcclVersion (or
// not NCCL) is passed over and listed, and the search goes on: a newer one may be further on.
// Only when none is usable is it an error, naming each one passed over.
// A missing NCCL is an error only where NCCL is needed (STRATA_COMM_BACKEND=nccl, or a
// communicator on a CUDA device); the error names every place searched and the fix.
#pragma once

#include <absl/status/status.h>

#include <string>
#include <vector>

namespace strata {

// 2.14: non-blocking communicators (ncclCommInitRankConfig, ncclCommFinalize).
inline constexpr int kMinNcclVersion = 21400;

struct NcclSearch {
  bool found() const { return handle != nullptr; }
  std::string path;  // the file loaded ("" when not found)
  int version = 0;   // ncclGetVersion's code: 22809 for 2.28.9
  std::string step;  // the step that found it ("STRATA_NCCL_SEARCH_PATH", ...)
  // Each place tried, in order, with what happened ("/x/libnccl.so.2: no such file").
  std::vector<std::string> tried;
  // The libraries loaded but not usable ("/x/libnccl.so.2 (STRATA_NCCL_SEARCH_PATH) is NCCL
  // 2.7.8; strata needs NCCL 2.14.0 or newer"), in search order.
  std::vector<std::string> passed_over;
  absl::Status error;      // OK when found; else what went wrong, every place tried and the fix
  void* handle = nullptr;  // dlopen's handle, for comm's table of NCCL functions
};

// The search above, made once per process; later calls return the same answer.
const NcclSearch& nccl_library();

// "2.28.9" for 22809 (and the pre-2.9 encoding, 2708 -> "2.7.8").
std::string nccl_version_text(int code);

// True where this build has the NCCL communicator (CUDA and nccl.h were found at build time).
bool nccl_backend_built();

// Why this build has the NCCL backend or not, as CMake decided (cmake/StrataNccl.cmake):
// "built against nccl.h 2.28.9 in /usr/local/cuda/include", or "not built: <why>. Fix: ...".
std::string_view nccl_backend_note();

// The pip wheel that carries NCCL for the CUDA major this build was made with
// ("nvidia-nccl-cu13" for CUDA 13; a build without CUDA names the current ones).
std::string_view nccl_wheel();

// The fix that ends every "no usable NCCL" message: "Fix: install torch's NCCL wheel (pip
// install nvidia-nccl-cu13), or set STRATA_NCCL_LIBRARY to the path of libnccl.so.2".
std::string nccl_fix();

}  // namespace strata
