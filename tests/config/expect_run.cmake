# Runs a command and checks its exit code and output (stdout and stderr together).
# CTest's PASS_REGULAR_EXPRESSION ignores the exit code, so command-line tests use this instead:
#   cmake -DEXPECT_EXIT=1 -DEXPECT_OUTPUT=regex [-DEXPECT_JSON_KEY=key] [-DENV=A=1;B=2]
#         -P expect_run.cmake -- program args...
# EXPECT_JSON_KEY: stdout must parse as JSON and hold that top-level key.
# EXPECT_NO_OUTPUT=regex: stdout and stderr must not match it.
# EXPECT_LINES_END (default ON): stdout and stderr, where not empty, end with a newline (a
#   message that does not runs into the shell's next prompt); OFF to skip the check.
set(command "")
set(seen_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(seen_separator)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(seen_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "expect_run.cmake: no command after --")
endif()

execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ENV} ${command}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("exit code: ${rc}\nstdout:\n${out}\nstderr:\n${err}")
if(DEFINED EXPECT_EXIT AND NOT rc STREQUAL EXPECT_EXIT)
  message(FATAL_ERROR "expected exit code ${EXPECT_EXIT}, got ${rc}")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT "${out}${err}" MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "output does not match '${EXPECT_OUTPUT}'")
endif()
if(DEFINED EXPECT_JSON_KEY)
  string(JSON value ERROR_VARIABLE json_error GET "${out}" "${EXPECT_JSON_KEY}")
  if(json_error)
    message(FATAL_ERROR "stdout is not JSON with key '${EXPECT_JSON_KEY}': ${json_error}")
  endif()
endif()
if(DEFINED EXPECT_NO_OUTPUT AND "${out}${err}" MATCHES "${EXPECT_NO_OUTPUT}")
  message(FATAL_ERROR "output matches '${EXPECT_NO_OUTPUT}', which it must not")
endif()
if(NOT DEFINED EXPECT_LINES_END OR EXPECT_LINES_END)
  foreach(stream IN ITEMS out err)
    string(LENGTH "${${stream}}" length)
    if(length GREATER 0)
      math(EXPR last_index "${length} - 1")
      string(SUBSTRING "${${stream}}" ${last_index} 1 last_char)
      if(NOT last_char STREQUAL "\n")
        message(FATAL_ERROR "std${stream} does not end with a newline")
      endif()
    endif()
  endforeach()
endif()
