# Installs strata from BUILD_DIR into a fresh prefix, builds tests/install/consumer against it
# with find_package(strata), and runs the result.
foreach(var BUILD_DIR WORK_DIR SOURCE_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake needs -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/include/strata/store/tier.h")
  message(FATAL_ERROR "headers were not installed under ${prefix}/include/strata/<layer>/")
endif()
if(EXISTS "${prefix}/include/strata/testing")
  message(FATAL_ERROR "test hooks (include/strata/testing/) were installed; they are not API")
endif()
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/tests/install/consumer" -B "${WORK_DIR}/build"
    -DCMAKE_PREFIX_PATH=${prefix} "-DCMAKE_CXX_FLAGS=${CONSUMER_CXX_FLAGS}"
    "-DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_CXX_FLAGS}")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
file(REMOVE_RECURSE "${WORK_DIR}")
