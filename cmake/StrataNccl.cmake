# NCCL's header for the NCCL backend (comm/): where it is found, or why the backend is left out.
# libnccl itself is never linked: comm/nccl_library.cc finds and loads it at run time.
#
# nccl.h is searched in STRATA_NCCL_INCLUDE_DIR when given, the CUDA toolkit's include folders,
# the nvidia/nccl/include folders of torch's NCCL wheel (nvidia-nccl-cuXX) on the sys.path of the
# Python interpreter the module is built for (on a pip install that is often the only nccl.h),
# then the system's include paths.
#
#   STRATA_WITH_NCCL (ON)       OFF leaves the NCCL backend out on purpose.
#   STRATA_NCCL_REQUIRED (OFF)  a CUDA build that finds no usable nccl.h fails, naming the wheel
#                               to install, instead of leaving the backend out with a status line
#                               (the pip build sets it: pip shows a build's output only when it
#                               fails, so a GPU wheel without NCCL would otherwise pass unseen).
#
# The header must be NCCL 2.18 or newer (comm/nccl_api.h names ncclCommSplit); the library
# loaded at run time may be older down to 2.14 (split is then made without ncclCommSplit).
set(STRATA_NCCL_HEADER_MIN_VERSION 2.18)
option(STRATA_WITH_NCCL "Build the NCCL backend where the CUDA toolkit and nccl.h are found" ON)
option(STRATA_NCCL_REQUIRED
       "Fail a CUDA build that finds no usable nccl.h instead of leaving NCCL out (pip sets it)" OFF)

# The wheel that carries NCCL for CUDA `major` (nvidia-nccl-cu13 for 13); without a CUDA major,
# both current ones.
function(strata_nccl_wheel major out)
  if(major)
    set(${out} "nvidia-nccl-cu${major}" PARENT_SCOPE)
  else()
    set(${out} "nvidia-nccl-cu12 or nvidia-nccl-cu13 (the CUDA of your torch)" PARENT_SCOPE)
  endif()
endfunction()

# The nvidia/nccl/include folders holding nccl.h on `python`'s sys.path, in sys.path's order.
# `checked` gets how many sys.path folders were looked at.
function(strata_python_nccl_include_dirs python out checked)
  set(dirs "")
  set(count 0)
  if(python)
    execute_process(
      COMMAND "${python}" -c
              "import os, sys\npaths = [p for p in sys.path if p and os.path.isdir(p)]\nprint(len(paths))\nfor p in paths:\n    d = os.path.join(p, 'nvidia', 'nccl', 'include')\n    if os.path.isfile(os.path.join(d, 'nccl.h')):\n        print(d)"
      RESULT_VARIABLE rc OUTPUT_VARIABLE lines ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0 AND lines)
      string(REPLACE "\n" ";" lines "${lines}")
      list(POP_FRONT lines count)
      set(dirs ${lines})
    endif()
  endif()
  set(${out} "${dirs}" PARENT_SCOPE)
  set(${checked} "${count}" PARENT_SCOPE)
endfunction()

# "2.28.9" from nccl.h's NCCL_MAJOR/MINOR/PATCH ("" when they are not there).
function(strata_nccl_header_version header out)
  file(STRINGS "${header}" defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  set(version "")
  foreach(part IN ITEMS MAJOR MINOR PATCH)
    if(defines MATCHES "NCCL_${part} +([0-9]+)")
      list(APPEND version ${CMAKE_MATCH_1})
    endif()
  endforeach()
  list(LENGTH version parts)
  if(parts EQUAL 3)
    list(JOIN version "." version)
  else()
    set(version "")
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# Decides whether the NCCL backend is built. Arguments: CUDA (ON when the CUDA backend is built),
# CUDA_VERSION, CUDA_INCLUDE_DIRS, PYTHON (the interpreter whose sys.path holds torch's wheels).
# Sets in the caller's scope:
#   STRATA_NCCL_BACKEND  ON or OFF
#   STRATA_NCCL_NOTE     one line for strata-info: what nccl.h was built against, or why not
#   STRATA_NCCL_WHEEL    the wheel the fix hints name (nvidia-nccl-cu13 for a CUDA 13 build)
# and STRATA_NCCL_INCLUDE_DIR (cache). A CUDA build without a usable nccl.h is a FATAL_ERROR
# naming the fix when STRATA_NCCL_REQUIRED is on, else one status line.
function(strata_configure_nccl)
  cmake_parse_arguments(ARG "" "CUDA;CUDA_VERSION;PYTHON" "CUDA_INCLUDE_DIRS" ${ARGN})
  set(major "")
  if(ARG_CUDA AND ARG_CUDA_VERSION MATCHES "^([0-9]+)")
    set(major ${CMAKE_MATCH_1})
  endif()
  strata_nccl_wheel("${major}" wheel)
  set(STRATA_NCCL_WHEEL "${wheel}" PARENT_SCOPE)
  set(STRATA_NCCL_BACKEND OFF PARENT_SCOPE)
  if(NOT ARG_CUDA)
    set(STRATA_NCCL_NOTE
        "not built: this build has no CUDA backend (no CUDA toolkit, or STRATA_WITH_CUDA=OFF)"
        PARENT_SCOPE)
    return()
  endif()
  if(NOT STRATA_WITH_NCCL)
    message(STATUS "strata: the NCCL backend is left out on purpose (STRATA_WITH_NCCL=OFF): "
                   "collectives use Gloo through host memory")
    set(STRATA_NCCL_NOTE "not built: left out on purpose (STRATA_WITH_NCCL=OFF at build time)"
        PARENT_SCOPE)
    return()
  endif()

  # A cached folder that no longer holds nccl.h (a wheel uninstalled since) is searched again.
  if(STRATA_NCCL_INCLUDE_DIR AND NOT EXISTS "${STRATA_NCCL_INCLUDE_DIR}/nccl.h")
    unset(STRATA_NCCL_INCLUDE_DIR CACHE)
  endif()
  strata_python_nccl_include_dirs("${ARG_PYTHON}" wheel_dirs sys_path_count)
  find_path(STRATA_NCCL_INCLUDE_DIR nccl.h HINTS ${ARG_CUDA_INCLUDE_DIRS} ${wheel_dirs}
            DOC "Folder of NCCL's nccl.h (the CUDA toolkit's, or torch's nvidia/nccl/include)")
  list(JOIN ARG_CUDA_INCLUDE_DIRS ", " cuda_dirs)
  if(NOT ARG_PYTHON)
    set(in_wheels "no Python interpreter to look for torch's NCCL wheel with")
  elseif(wheel_dirs)
    list(JOIN wheel_dirs ", " in_wheels)
    string(CONCAT in_wheels "nvidia/nccl/include on the sys.path of ${ARG_PYTHON} (${in_wheels})")
  else()
    string(CONCAT in_wheels "nvidia/nccl/include on the sys.path of ${ARG_PYTHON} (none of its "
                            "${sys_path_count} folders has one)")
  endif()
  string(CONCAT searched "${cuda_dirs}, ${in_wheels} and the system's include paths")
  string(CONCAT fix "install torch's NCCL wheel into the Python that builds strata (pip install "
                    "${wheel}, which a CUDA build of torch brings along) and build again, or set "
                    "STRATA_NCCL_INCLUDE_DIR to the folder of nccl.h, or build without NCCL on "
                    "purpose with -DSTRATA_WITH_NCCL=OFF (pip: CMAKE_ARGS=-DSTRATA_WITH_NCCL=OFF)")

  set(problem "")
  if(NOT STRATA_NCCL_INCLUDE_DIR)
    string(CONCAT problem "CUDA ${ARG_CUDA_VERSION} was found but NCCL's header nccl.h was not "
                          "(searched ${searched})")
  else()
    strata_nccl_header_version("${STRATA_NCCL_INCLUDE_DIR}/nccl.h" version)
    if(NOT version)
      string(CONCAT problem "${STRATA_NCCL_INCLUDE_DIR}/nccl.h does not say its NCCL version "
                            "(NCCL_MAJOR/MINOR/PATCH): it is not NCCL's header")
    elseif(version VERSION_LESS STRATA_NCCL_HEADER_MIN_VERSION)
      string(CONCAT problem "${STRATA_NCCL_INCLUDE_DIR}/nccl.h is NCCL ${version}, but the NCCL "
                            "backend needs the header of NCCL ${STRATA_NCCL_HEADER_MIN_VERSION} "
                            "or newer")
    endif()
  endif()
  if(problem)
    if(STRATA_NCCL_REQUIRED)
      message(FATAL_ERROR "strata: ${problem}. Without a usable nccl.h this GPU build would have "
                          "no NCCL backend: its collectives would run on Gloo through host "
                          "memory. Fix: ${fix}.")
    endif()
    message(STATUS "strata: ${problem}: the NCCL backend is left out, collectives use Gloo. "
                   "Fix: ${fix}")
    set(STRATA_NCCL_NOTE "not built: ${problem}. Fix: ${fix}" PARENT_SCOPE)
    return()
  endif()
  message(STATUS "strata: nccl.h ${version} found in ${STRATA_NCCL_INCLUDE_DIR}; building the "
                 "NCCL backend (libnccl is loaded at run time)")
  set(STRATA_NCCL_BACKEND ON PARENT_SCOPE)
  set(STRATA_NCCL_NOTE "built against nccl.h ${version} in ${STRATA_NCCL_INCLUDE_DIR}" PARENT_SCOPE)
endfunction()
