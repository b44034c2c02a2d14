# CTest python.no_numpy_api: the Python module never uses numpy's C API (bindings/python/
# host_array.h says why). Fails when a file under BINDINGS_DIR includes pybind11/numpy.h, or when
# the built module (MODULE) names numpy's C-API capsule (_ARRAY_API), which pybind11/numpy.h
# imports at its first array.
#   cmake -DBINDINGS_DIR=<src>/bindings/python -DMODULE=<build>/python/strata/_strata*.so -P this
foreach(var BINDINGS_DIR MODULE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_no_numpy_api: -D${var}=... is required")
  endif()
endforeach()

set(found "")
file(GLOB_RECURSE sources ${BINDINGS_DIR}/*.h ${BINDINGS_DIR}/*.hpp ${BINDINGS_DIR}/*.cc
     ${BINDINGS_DIR}/*.cpp)
foreach(source IN LISTS sources)
  file(STRINGS ${source} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]pybind11/numpy\\.h[>\"]")
  if(lines)
    list(APPEND found "${source} includes pybind11/numpy.h")
  endif()
endforeach()
if(NOT EXISTS ${MODULE})
  list(APPEND found "the module ${MODULE} does not exist (build the strata_python target)")
else()
  file(STRINGS ${MODULE} api REGEX "_ARRAY_API")
  if(api)
    list(APPEND found "${MODULE} names numpy's C API (_ARRAY_API)")
  endif()
endif()
if(found)
  list(JOIN found "\n  " text)
  message(FATAL_ERROR "the Python module must not use numpy's C API (pybind11/numpy.h); take "
                      "arrays through the buffer protocol or DLPack (bindings/python/host_array.h)"
                      ":\n  ${text}")
endif()
list(LENGTH sources n)
message(STATUS "no numpy C API: ${n} bindings sources and ${MODULE} checked")
