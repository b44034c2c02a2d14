# Checks that no file needs the shared CUDA runtime or NCCL: the runtime is linked statically
# (CUDA::cudart_static) and NCCL is loaded at run time (comm/nccl_library.cc), so one build runs
# with and without a GPU and NCCL.
#   cmake -DREADELF=readelf "-DFILES=a|b" -P no_shared_cuda.cmake
string(REPLACE "|" ";" FILES "${FILES}")
foreach(file IN LISTS FILES)
  execute_process(COMMAND ${READELF} -d ${file} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${READELF} -d ${file} failed: ${err}")
  endif()
  string(REGEX MATCHALL "NEEDED[^\n]*\\[(libcudart|libnccl)[^]\n]*\\]" needed "${out}")
  if(needed)
    message(FATAL_ERROR "${file} needs ${needed}: link CUDA::cudart_static, and load NCCL "
                        "through comm/nccl_library.cc rather than linking it")
  endif()
  message("${file}: no shared CUDA runtime, no NCCL")
endforeach()
