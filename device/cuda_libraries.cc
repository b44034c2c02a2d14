#include "strata/device/cuda_libraries.h"

#include <dlfcn.h>
#include <link.h>

#include "strata/base/text.h"

#if defined(STRATA_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace strata {

CudaLibraries cuda_libraries() {
  CudaLibraries out;
#if defined(STRATA_HAVE_CUDA)
  out.runtime_built = true;
  if (cudaRuntimeGetVersion(&out.runtime_version) != cudaSuccess) out.runtime_version = 0;
#endif
  // The driver as the runtime finds it (by its soname); the handle is dropped again.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    const char* e = dlerror();
    out.driver_error = e != nullptr ? e : "dlopen failed";
    return out;
  }
  out.driver_found = true;
  link_map* map = nullptr;
  if (dlinfo(driver, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    out.driver_path = map->l_name;
  }
  using GetVersion = int (*)(int*);  // CUresult cuDriverGetVersion(int*)
  if (auto get = reinterpret_cast<GetVersion>(dlsym(driver, "cuDriverGetVersion"));
      get == nullptr || get(&out.driver_version) != 0) {
    out.driver_version = 0;
  }
  dlclose(driver);
  return out;
}

std::string cuda_version_text(int code) { return text::cat(code / 1000, ".", code % 1000 / 10); }

}  // namespace strata
