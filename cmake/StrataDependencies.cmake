# All dependencies come from Debian packages (tools/install-deps.sh installs them) and, optionally,
# the CUDA toolkit under /usr/local/cuda. Nothing is downloaded at build time.

find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(absl REQUIRED CONFIG)
find_package(TBB REQUIRED CONFIG)
pkg_check_modules(liburing REQUIRED IMPORTED_TARGET GLOBAL liburing>=2.0)
pkg_check_modules(libxxhash REQUIRED IMPORTED_TARGET GLOBAL libxxhash)
# Gloo (Debian's libgloo-dev): the collective engine for host buffers and GPU-less machines.
find_package(Gloo REQUIRED CONFIG)
# nlohmann-json3-dev (header-only): every JSON document strata writes (docs/architecture.md).
find_package(nlohmann_json 3 REQUIRED)
if(BUILD_TESTING)
  find_package(Catch2 2 REQUIRED CONFIG)
endif()

# CUDA: on by default where the toolkit is found; otherwise the CUDA parts are left out.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
find_package(CUDAToolkit QUIET)
option(STRATA_WITH_CUDA "Build the CUDA device backend" ${CUDAToolkit_FOUND})
if(STRATA_WITH_CUDA AND NOT CUDAToolkit_FOUND)
  message(FATAL_ERROR "STRATA_WITH_CUDA=ON but no CUDA toolkit was found; install it under "
                      "/usr/local/cuda, set CUDAToolkit_ROOT, or configure with -DSTRATA_WITH_CUDA=OFF")
endif()
if(STRATA_WITH_CUDA)
  message(STATUS "strata: CUDA ${CUDAToolkit_VERSION} found in ${CUDAToolkit_BIN_DIR}; "
                 "building the CUDA backend")
else()
  message(STATUS "strata: CUDA toolkit not found: the CUDA backend is left out "
                 "(host backend only)")
endif()

# NCCL: only its header at build time, from the CUDA toolkit or torch's nvidia-nccl wheel on the
# sys.path of the interpreter the Python module is built for (bindings/python picks the same one:
# Python3_EXECUTABLE, else /usr/bin/python3). The library is loaded at run time, never linked.
include(StrataNccl)
if(DEFINED Python3_EXECUTABLE)
  set(strata_nccl_python "${Python3_EXECUTABLE}")
elseif(EXISTS /usr/bin/python3)
  set(strata_nccl_python /usr/bin/python3)
else()
  find_program(strata_nccl_python NAMES python3)
endif()
strata_configure_nccl(CUDA ${STRATA_WITH_CUDA} CUDA_VERSION "${CUDAToolkit_VERSION}"
                      CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS} PYTHON "${strata_nccl_python}")
