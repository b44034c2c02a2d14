# Build options and the flags every strata target gets.

set(STRATA_SANITIZE "" CACHE STRING
    "Sanitizers for the whole build: empty, 'address,undefined' or 'thread'")
set_property(CACHE STRATA_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")

if(STRATA_SANITIZE)
  if(NOT STRATA_SANITIZE MATCHES "^(address,undefined|undefined,address|address|undefined|thread)$")
    message(FATAL_ERROR "STRATA_SANITIZE='${STRATA_SANITIZE}' is not supported; "
                        "use 'address,undefined' or 'thread'")
  endif()
  add_compile_options(-fsanitize=${STRATA_SANITIZE} -fno-omit-frame-pointer
                      -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${STRATA_SANITIZE})
  # Line tables only (-g1 after the build type's -g): a sanitizer's report names every frame's
  # function, file and line, which is what these builds are for; the full debug info of local
  # variables and types made each file take a quarter longer to compile (26% under ASan, 27%
  # under TSan on 8 of the largest files). A debugger session wants a plain Debug build.
  add_compile_options(-g1)
  # A Debug build under ASan/UBSan runs at -O1 instead of -O0, as AddressSanitizer's own
  # documentation advises: every access is still instrumented and assertions stay on (NDEBUG is
  # not defined), but the suite runs several times faster (the trainers' arithmetic at -O0 was
  # most of CI's time).
  if(STRATA_SANITIZE MATCHES "address")
    add_compile_options($<$<CONFIG:Debug>:-O1>)
    # The tests and tools (harness code, not the runtime's hot paths: those stay at -O1) compile
    # at -O0 instead, through STRATA_HARNESS_COMPILE_OPTIONS: under ASan+UBSan at -O1 a Catch2
    # test file took 6x as long to compile (c_api_zero_test.cc 30.8 s against 4.8 s), and the
    # tests were half of the sanitizer build's time, for code whose speed no test depends on.
    set(STRATA_HARNESS_COMPILE_OPTIONS $<$<CONFIG:Debug>:-O0>)
  endif()
  if(STRATA_SANITIZE STREQUAL "thread")
    # The harness at -O1 rather than RelWithDebInfo's -O2 (the runtime keeps -O2): a third less
    # compile time per Catch2 file under TSan (c_api_zero_test.cc 6.5 s against 4.3 s), while
    # the test code's own loops stay compiled (at -O0 TSan would instrument every spilled local).
    set(STRATA_HARNESS_COMPILE_OPTIONS $<$<CONFIG:RelWithDebInfo>:-O1>)
    # Debian's Abseil is not built with TSan, so strata::MutexLock tells TSan about lock edges.
    add_compile_definitions(STRATA_TSAN=1)
  endif()
else()
  # The Release build's harness (tests) compiles at -O1: a third less time than -O3 for code
  # whose speed no test measures. The runtime, the tools (benchmarks) and the examples keep
  # -O3.
  set(STRATA_HARNESS_COMPILE_OPTIONS $<$<CONFIG:Release>:-O1>)
endif()

# Warnings-as-errors is for developers and CI (`make test` turns it on), not forced on users:
# a new compiler's new warning must not stop someone building a release.
option(STRATA_WERROR "Treat compiler warnings in strata's own code as errors" OFF)

# Warnings on our own code only (not on third-party headers, which are SYSTEM); errors with
# STRATA_WERROR=ON.
# GCC 12 at -O2/-O3 (Release) reports false -Wrestrict errors inside libstdc++'s
# std::string operator+ ("'" + s + "'"; GCC bugs 105329 and 105651, fixed in GCC 13), so
# -Wrestrict is off for GCC 12 only.
set(strata_gcc12 "$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_GREATER_EQUAL:$<CXX_COMPILER_VERSION>,12>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>")
function(strata_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                         -Wno-sign-conversion -Wnon-virtual-dtor -Woverloaded-virtual
                         $<${strata_gcc12}:-Wno-restrict> $<$<BOOL:${STRATA_WERROR}>:-Werror>)
endfunction()

# One library per layer folder. HEADERS names the folder of its public headers under
# include/strata/ (and TESTING_HEADERS its test hooks under include/strata/testing/). Each layer
# sees only its own headers and those of the layers it links: the build tree gives every layer an
# include folder of its own that links to just its headers, so an include of a higher floor's
# header does not compile (the layering is enforced, not a convention).
function(strata_add_layer name)
  cmake_parse_arguments(ARG "" "HEADERS" "SOURCES;TESTING_HEADERS;HEADER_FILES;PUBLIC_DEPS;PRIVATE_DEPS"
                        ${ARGN})
  set(staged ${PROJECT_BINARY_DIR}/layer-include/${name})
  file(MAKE_DIRECTORY ${staged}/strata/testing)
  if(ARG_HEADERS)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/strata/${ARG_HEADERS}
         ${staged}/strata/${ARG_HEADERS} SYMBOLIC)
  endif()
  foreach(header IN LISTS ARG_TESTING_HEADERS)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/strata/testing/${header}
         ${staged}/strata/testing/${header} SYMBOLIC)
  endforeach()
  foreach(header IN LISTS ARG_HEADER_FILES)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/strata/${header} ${staged}/strata/${header}
         SYMBOLIC)
  endforeach()
  if(ARG_SOURCES)
    add_library(${name} STATIC ${ARG_SOURCES})
    target_include_directories(${name}
      PUBLIC $<BUILD_INTERFACE:${staged}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
      PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
    strata_target_warnings(${name})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name}
      INTERFACE $<BUILD_INTERFACE:${staged}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(${name} INTERFACE ${ARG_PUBLIC_DEPS})
  endif()
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${name})
  add_library(strata::${name} ALIAS ${name})
  set_property(GLOBAL APPEND PROPERTY STRATA_LAYER_TARGETS ${name})
endfunction()
