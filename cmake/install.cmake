# `cmake --install`: the troupe binary, the plain layers (kernels, moe, model,
# rl, and the Cap'n Proto schemas that model's checkpoints use) as static
# libraries with their headers under include/troupe/, and a CMake package
# config, so that a downstream project can write
#   find_package(troupe REQUIRED)
#   target_link_libraries(app PRIVATE troupe::model troupe::rl)
# (with `project(app C CXX)`: Cap'n Proto's config needs C). Tested by
# tests/launch/package_test.sh, which installs to a temporary prefix and builds
# tests/launch/package_consumer/ against it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TROUPE_PACKAGE_LIBS troupe_kernels troupe_moe troupe_model troupe_rl troupe_schemas)
foreach(lib IN LISTS TROUPE_PACKAGE_LIBS)
  string(REPLACE "troupe_" "" short ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short})
endforeach()

install(TARGETS troupe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${TROUPE_PACKAGE_LIBS} EXPORT troupeTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe)
foreach(dir kernels moe model rl)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/${dir}
          FILES_MATCHING PATTERN "*.hpp")
endforeach()
install(DIRECTORY ${PROJECT_BINARY_DIR}/schemas/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/schemas
        FILES_MATCHING PATTERN "*.capnp.h")

set(TROUPE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)
install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${TROUPE_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/troupeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/troupeConfig.cmake INSTALL_DESTINATION ${TROUPE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
  DESTINATION ${TROUPE_CMAKE_DIR})
