# cmake/StrataNccl.cmake, case by case, in script mode (no build, a few seconds): where nccl.h is
# found (the CUDA toolkit's, or torch's nvidia/nccl/include wheel folder on a Python's sys.path),
# what a build without it says, and the pip build's error naming the wheel and the opt-out.
#   cmake -DSOURCE_DIR=<strata> -DWORK=<scratch folder> -DPYTHON=<python3> [-DNCCL_H=<a real
#         nccl.h for the fake wheel; else a fake header>] -P strata_nccl_test.cmake
# Each case runs in a cmake -P of its own (CASE=...), with the system's include paths left out of
# the search (CMAKE_FIND_USE_*), so that an nccl.h installed there cannot decide a case.
cmake_minimum_required(VERSION 3.25)

if(DEFINED CASE)
  set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH FALSE)
  set(CMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH FALSE)
  set(CMAKE_FIND_USE_CMAKE_ENVIRONMENT_PATH FALSE)
  include(${SOURCE_DIR}/cmake/StrataNccl.cmake)
  set(STRATA_NCCL_REQUIRED ${REQUIRED})
  set(STRATA_WITH_NCCL ${WITH_NCCL})
  strata_configure_nccl(CUDA ${CUDA} CUDA_VERSION "${CUDA_VERSION}"
                        CUDA_INCLUDE_DIRS ${CUDA_INCLUDE} PYTHON "${PYTHON}")
  message("RESULT backend=${STRATA_NCCL_BACKEND} dir=${STRATA_NCCL_INCLUDE_DIR} "
          "wheel=${STRATA_NCCL_WHEEL} note=${STRATA_NCCL_NOTE}")
  return()
endif()

# A folder holding nccl.h as `header` (a fake of `version` when `header` is empty or missing).
function(make_include dir header version)
  file(MAKE_DIRECTORY ${dir})
  if(header AND EXISTS "${header}")
    file(CREATE_LINK ${header} ${dir}/nccl.h SYMBOLIC)
  else()
    string(REPLACE "." ";" parts ${version})
    list(GET parts 0 major)
    list(GET parts 1 minor)
    list(GET parts 2 patch)
    file(WRITE ${dir}/nccl.h "#define NCCL_MAJOR ${major}\n#define NCCL_MINOR ${minor}\n"
                             "#define NCCL_PATCH ${patch}\n")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
set(site ${WORK}/site-packages)            # torch's wheels: site-packages/nvidia/nccl/include
set(old_site ${WORK}/old-site-packages)    # an NCCL too old for the backend
set(toolkit ${WORK}/cuda/include)          # a CUDA toolkit with nccl.h
set(bare_toolkit ${WORK}/bare-cuda/include)  # one without
make_include(${site}/nvidia/nccl/include "${NCCL_H}" 2.27.7)
make_include(${old_site}/nvidia/nccl/include "" 2.16.5)
make_include(${toolkit} "" 2.28.9)
file(MAKE_DIRECTORY ${bare_toolkit} ${WORK}/empty-site)

set(failures 0)
# check(<name> <expected exit: 0 or 1> <regex the output must match> [VAR=value ...])
function(check name exit_code expect)
  set(defaults CUDA=ON CUDA_VERSION=13.0.88 CUDA_INCLUDE=${bare_toolkit} REQUIRED=OFF
               WITH_NCCL=ON PYTHONPATH=${WORK}/empty-site)
  set(args "")
  set(env "")
  foreach(pair IN LISTS defaults ARGN)
    string(REGEX MATCH "^([A-Z_]+)=(.*)$" _ "${pair}")
    set(value_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
  endforeach()
  foreach(key IN ITEMS CUDA CUDA_VERSION CUDA_INCLUDE REQUIRED WITH_NCCL)
    list(APPEND args "-D${key}=${value_${key}}")
  endforeach()
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env PYTHONPATH=${value_PYTHONPATH} PYTHONNOUSERSITE=1
            ${CMAKE_COMMAND} -DCASE=${name} -DSOURCE_DIR=${SOURCE_DIR} -DPYTHON=${PYTHON} ${args}
            -P ${CMAKE_CURRENT_LIST_FILE}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(output "${out}${err}")
  string(REGEX REPLACE "[ \n]+" " " output "${output}")  # CMake wraps its errors
  if(NOT rc EQUAL exit_code OR NOT output MATCHES "${expect}")
    message("FAIL ${name}: exit ${rc} (expected ${exit_code}); output does not match '${expect}':\n"
            "${out}${err}")
    math(EXPR failures "${failures} + 1")
    set(failures ${failures} PARENT_SCOPE)
  else()
    message("ok   ${name}")
  endif()
endfunction()

string(REPLACE "." "\\." site_re "${site}")
string(REPLACE "." "\\." toolkit_re "${toolkit}")

# The pip case: no nccl.h under the CUDA toolkit, torch's NCCL wheel on the interpreter's sys.path.
check(wheel_only 0 "backend=ON dir=${site_re}/nvidia/nccl/include wheel=nvidia-nccl-cu13 note=built against nccl.h 2\\.[0-9]+\\.[0-9]+ in ${site_re}/nvidia/nccl/include"
      PYTHONPATH=${site} REQUIRED=ON)
# The CUDA toolkit's header comes first.
check(toolkit_first 0 "backend=ON dir=${toolkit_re} .*note=built against nccl.h 2\\.28\\.9"
      CUDA_INCLUDE=${toolkit} PYTHONPATH=${site})
# Neither: a plain build leaves the backend out with a status line and says why in its note...
check(none_plain 0 "strata: CUDA 13\\.0\\.88 was found but NCCL's header nccl\\.h was not .*: the NCCL backend is left out.*backend=OFF .*note=not built: CUDA 13\\.0\\.88 was found but NCCL's header nccl\\.h was not \\(searched ${WORK}/bare-cuda/include, nvidia/nccl/include on the sys\\.path of [^ ]+ \\(none of its [0-9]+ folders has one\\) and the system's include paths\\)\\. Fix: install torch's NCCL wheel .*pip install nvidia-nccl-cu13")
# ... and the pip build (STRATA_NCCL_REQUIRED) fails, naming the wheel and the opt-out.
check(none_pip 1 "CMake Error.*nccl\\.h was not .*Fix: install torch's NCCL wheel into the Python that builds strata \\(pip install nvidia-nccl-cu13, .*CMAKE_ARGS=-DSTRATA_WITH_NCCL=OFF"
      REQUIRED=ON)
# The wheel of the CUDA major the build uses.
check(none_cuda12 1 "pip install nvidia-nccl-cu12," REQUIRED=ON CUDA_VERSION=12.4.1)
# Opted out: no error, even in the pip build.
check(opted_out 0 "left out on purpose.*backend=OFF .*note=not built: left out on purpose \\(STRATA_WITH_NCCL=OFF"
      REQUIRED=ON WITH_NCCL=OFF PYTHONPATH=${site})
# No CUDA: nothing to find, no error; the hint names both wheels.
check(no_cuda 0 "backend=OFF .*wheel=nvidia-nccl-cu12 or nvidia-nccl-cu13 .*note=not built: this build has no CUDA backend"
      REQUIRED=ON CUDA=OFF CUDA_VERSION=)
# A header too old for the backend: named with its version.
check(old_header 1 "old-site-packages/nvidia/nccl/include/nccl\\.h is NCCL 2\\.16\\.5, but the NCCL backend needs the header of NCCL 2\\.18 or newer"
      REQUIRED=ON PYTHONPATH=${old_site})

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} case(s) failed")
endif()
message("strata_nccl_test: all cases passed")
