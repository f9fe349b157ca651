# Installing sgpu: libraries, headers, the CMake package (find_package(sgpu)) and a .deb.
include(CMakePackageConfigHelpers)

set(_sgpu_exported sgpu_headers sgpu_errors sgpu_contract sgpu_model sgpu_collectives sgpu_serialize sgpu_backend sgpu_sim sgpu_backends
  sgpu_rendezvous sgpu_tracking sgpu_rank sgpu_nodes sgpu_launcher sgpu sgpu_parallel sgpu_checkpoint sgpu_data)
if(SGPU_WITH_CUDA)
  list(APPEND _sgpu_exported sgpu_backend_cuda)
endif()
set(SGPU_HAS_GTEST_MAIN 0)
set(SGPU_HAS_BENCHMARK_MAIN 0)
if(TARGET sgpu_gtest_main)
  list(APPEND _sgpu_exported sgpu_gtest_main)
  set(SGPU_HAS_GTEST_MAIN 1)
endif()
if(TARGET sgpu_benchmark_main)
  list(APPEND _sgpu_exported sgpu_benchmark_main)
  set(SGPU_HAS_BENCHMARK_MAIN 1)
endif()
# Exported as sgpu::<name without the prefix>: sgpu::sgpu, sgpu::sim, sgpu::gtest_main, ...
foreach(target IN LISTS _sgpu_exported)
  string(REGEX REPLACE "^sgpu_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
endforeach()

install(TARGETS ${_sgpu_exported} EXPORT sgpuTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(SGPU_WITH_CUDA)
  install(TARGETS sgpu_cuda_runtime LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(TARGETS sgpu_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The collective model's platform files, read at run time (model/platform.h).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/model/platforms/ DESTINATION ${CMAKE_INSTALL_DATADIR}/sgpu/platforms
  FILES_MATCHING PATTERN "*.json")
# The public headers, and only they: include/sgpu/ is all a consumer gets at the include
# root. Public headers include nothing outside sgpu/ (ci/check-architecture).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/src/sgpu DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h" PATTERN "mains" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/include/sgpu/config.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/sgpu)

set(_sgpu_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/sgpu)
install(EXPORT sgpuTargets NAMESPACE sgpu:: DESTINATION ${_sgpu_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sgpuConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sgpuConfig.cmake INSTALL_DESTINATION ${_sgpu_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sgpuConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sgpuConfig.cmake ${PROJECT_BINARY_DIR}/sgpuConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/SgpuTorch.cmake ${PROJECT_SOURCE_DIR}/cmake/SgpuTorchTargets.cmake
  DESTINATION ${_sgpu_cmake_dir})

# cpack -G DEB: a package for nodes provisioned from packages. libtorch comes from the
# torch wheel, which no Debian package provides: the package names only Debian's parts.
set(CPACK_PACKAGE_NAME sgpu)
set(CPACK_PACKAGE_VENDOR sgpu)
set(CPACK_PACKAGE_CONTACT "sgpu maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Run one C++ function on every GPU of a node, real or simulated")
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "libcereal-dev, nlohmann-json3-dev, zlib1g-dev, libsqlite3-dev, libgloo-dev, libgtest-dev, libbenchmark-dev")
# The same prefix the build compiled in (where the cuda backend looks for its module).
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
include(CPack)
