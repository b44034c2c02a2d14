// Which CUDA libraries this process has, for strata-info: the CUDA runtime (linked statically
// into strata, as PyTorch extensions link it) and the GPU driver (libcuda.so.1, which the
// runtime loads itself at run time: a machine without it runs on the host backend).
#pragma once

#include <string>

namespace strata {

struct CudaLibraries {
  bool runtime_built = false;  // this build has the CUDA backend (and the static runtime)
  int runtime_version = 0;     // cudaRuntimeGetVersion: 12080 for 12.8
  bool driver_found = false;
  std::string driver_path;   // where libcuda.so.1 was loaded from
  int driver_version = 0;    // cuDriverGetVersion: the newest CUDA the driver supports
  std::string driver_error;  // why it was not found (dlerror's words)
};

CudaLibraries cuda_libraries();

// "12.8" for 12080.
std::string cuda_version_text(int code);

}  // namespace strata
