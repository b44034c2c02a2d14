# Install headers, libraries and a CMake package so that another project can
#   find_package(strata) and target_link_libraries(app PRIVATE strata::strata)
include(CMakePackageConfigHelpers)

get_property(strata_layers GLOBAL PROPERTY STRATA_LAYER_TARGETS)
install(TARGETS ${strata_layers} strata EXPORT strataTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Test hooks (include/strata/testing/) are not part of the installed API.
install(DIRECTORY include/strata DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} PATTERN testing EXCLUDE)
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

configure_package_config_file(cmake/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/strata)

# pkg-config: strata.pc for builds without CMake (cc app.c $(pkg-config --cflags --libs strata)).
# The layers' own dependencies become Requires (pkg-config names) or Libs, found by walking the
# layer targets, so a new dependency of a layer reaches the .pc file without editing it here.
function(strata_pkg_config_dependencies layers out_requires out_libs)
  set(requires "")
  set(libs "")
  foreach(layer IN LISTS layers)
    get_target_property(type ${layer} TYPE)
    if(type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(deps ${layer} INTERFACE_LINK_LIBRARIES)
    else()
      get_target_property(deps ${layer} LINK_LIBRARIES)
    endif()
    if(NOT deps)
      continue()
    endif()
    foreach(dep IN LISTS deps)
      if(dep IN_LIST layers OR dep MATCHES "^strata")
        continue()  # another layer: listed in Libs by name
      elseif(dep MATCHES "^absl::(.+)$")
        list(APPEND requires "absl_${CMAKE_MATCH_1}")
      elseif(dep STREQUAL "TBB::tbb")
        list(APPEND requires tbb)
      elseif(dep MATCHES "^PkgConfig::(.+)$")
        list(APPEND requires "${CMAKE_MATCH_1}")
      elseif(dep STREQUAL "gloo")
        list(APPEND libs -lgloo)  # Debian's libgloo-dev ships no .pc file
      elseif(dep STREQUAL "nlohmann_json::nlohmann_json")
        continue()  # header-only, used inside the archives: nothing to link
      elseif(dep STREQUAL "Threads::Threads")
        list(APPEND libs -pthread)
      elseif(dep STREQUAL "CUDA::cudart_static")
        # The static CUDA runtime needs dlopen (it loads libcuda.so.1 itself) and librt.
        list(APPEND libs "-L${CUDAToolkit_LIBRARY_DIR}" -lcudart_static -ldl -lrt -pthread)
      elseif(dep MATCHES "^CUDA::(.+)$")
        list(APPEND libs "-L${CUDAToolkit_LIBRARY_DIR}" "-l${CMAKE_MATCH_1}")
      elseif(dep STREQUAL "${CMAKE_DL_LIBS}")
        list(APPEND libs "-l${dep}")  # dlopen (the NCCL loader)
      elseif(IS_ABSOLUTE "${dep}")
        list(APPEND libs "${dep}")  # a library found by path
      else()
        message(WARNING "strata.pc: no pkg-config name for ${layer}'s dependency '${dep}'; "
                        "add it to strata_pkg_config_dependencies in cmake/StrataInstall.cmake")
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES requires)
  list(REMOVE_DUPLICATES libs)
  set(${out_requires} "${requires}" PARENT_SCOPE)
  set(${out_libs} "${libs}" PARENT_SCOPE)
endfunction()

# Archives in link order: each layer before the layers it uses (the reverse of their creation).
set(strata_pc_archives "")
foreach(layer IN LISTS strata_layers)
  get_target_property(type ${layer} TYPE)
  if(type STREQUAL "STATIC_LIBRARY")
    list(PREPEND strata_pc_archives "-l${layer}")
  endif()
endforeach()
strata_pkg_config_dependencies("${strata_layers}" strata_pc_requires strata_pc_dep_libs)
list(JOIN strata_pc_requires ", " STRATA_PC_REQUIRES)
list(JOIN strata_pc_archives " " strata_pc_archives_text)
list(JOIN strata_pc_dep_libs " " strata_pc_dep_libs_text)
set(STRATA_PC_LIBS "${strata_pc_archives_text} ${strata_pc_dep_libs_text} -lstdc++ -lm")
set(strata_pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(IS_ABSOLUTE "${strata_pc_dir}")
  set(STRATA_PC_PREFIX "")
  set(STRATA_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH STRATA_PC_PREFIX "/root/${strata_pc_dir}" "/root")
  string(REGEX REPLACE "/$" "" STRATA_PC_PREFIX "${STRATA_PC_PREFIX}")
  set(STRATA_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(STRATA_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(STRATA_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/strata.pc.in ${PROJECT_BINARY_DIR}/strata.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/strata.pc DESTINATION ${strata_pc_dir})
