# cmake --install: the library (gdn, and gdn_cuda when built), the public headers, the gdn tool,
# a CMake package (find_package(gdn) gives gdn::gdn and, with CUDA, gdn::gdn_cuda) and pkg-config
# files. Every rule here is in the default component, so the Python build, which installs only the
# component "python" (pyproject.toml), is unaffected.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(gdn_targets gdn)
if(GDN_CUDA)
  list(APPEND gdn_targets gdn_cuda)
endif()
install(TARGETS ${gdn_targets} EXPORT gdnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS gdn_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/gdn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(gdn_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/gdn)
install(EXPORT gdnTargets NAMESPACE gdn:: DESTINATION ${gdn_cmake_dir})
# The options gdn was built with: gdnConfig.cmake finds the dependencies they bring.
set(gdn_with_mpi ${GDN_MPI})
set(gdn_with_cuda ${GDN_CUDA})
set(gdn_with_nccl OFF)
if(GDN_CUDA AND GDN_NCCL)
  set(gdn_with_nccl ON)
endif()
configure_package_config_file(cmake/gdnConfig.cmake.in ${PROJECT_BINARY_DIR}/gdnConfig.cmake
                              INSTALL_DESTINATION ${gdn_cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/gdnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/gdnConfig.cmake ${PROJECT_BINARY_DIR}/gdnConfigVersion.cmake
        DESTINATION ${gdn_cmake_dir})

# pkg-config: paths relative to the .pc file, so any --prefix works. gdn is a static library
# unless BUILD_SHARED_LIBS: then what it links goes to Libs.private instead of Libs.
file(RELATIVE_PATH gdn_pc_prefix /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
set(gdn_pc_deps ${OpenMP_CXX_FLAGS})
if(GDN_MPI)
  list(APPEND gdn_pc_deps ${MPI_CXX_LINK_FLAGS} ${MPI_CXX_LIBRARIES})
endif()
set(gdn_cuda_pc_deps)
if(GDN_CUDA)
  list(APPEND gdn_cuda_pc_deps -L${CUDAToolkit_LIBRARY_DIR} -lcudart)
  if(GDN_NCCL)
    list(APPEND gdn_cuda_pc_deps ${NCCL_LIBRARY})
  endif()
endif()
list(JOIN gdn_pc_deps " " gdn_pc_deps)
list(JOIN gdn_cuda_pc_deps " " gdn_cuda_pc_deps)
if(BUILD_SHARED_LIBS)
  set(gdn_pc_libs_private "Libs.private: ${gdn_pc_deps}")
  set(gdn_cuda_pc_libs_private "Libs.private: ${gdn_cuda_pc_deps}")
  set(gdn_pc_deps "")
  set(gdn_cuda_pc_deps "")
endif()
configure_file(cmake/gdn.pc.in ${PROJECT_BINARY_DIR}/gdn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/gdn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(GDN_CUDA)
  configure_file(cmake/gdn-cuda.pc.in ${PROJECT_BINARY_DIR}/gdn-cuda.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/gdn-cuda.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
