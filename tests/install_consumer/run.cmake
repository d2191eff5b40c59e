# cmake -P run.cmake: installs the build (BUILD_DIR) into WORK_DIR/prefix, builds this directory's
# project against it (find_package(gdn)), compiles main.cpp again with pkg-config's flags, and
# runs both programs and the installed gdn tool. Fails on the first step that fails.
foreach(var BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "install_consumer: failed (${rc}): ${command}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
step(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
step(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
     -DCMAKE_CXX_COMPILER=${CXX} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_PREFIX_PATH=${prefix})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
step(${WORK_DIR}/build/consumer)

find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} "")
  file(GLOB_RECURSE pc_files ${prefix}/gdn.pc)
  list(GET pc_files 0 pc_file)
  get_filename_component(pc_dir ${pc_file} DIRECTORY)
  set(ENV{PKG_CONFIG_PATH} ${pc_dir})
  set(package gdn)
  if(EXISTS ${pc_dir}/gdn-cuda.pc)
    set(package gdn-cuda)
  endif()
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs ${package} OUTPUT_VARIABLE flags
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: pkg-config --cflags --libs ${package} failed")
  endif()
  message(STATUS "pkg-config --cflags --libs ${package}: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  separate_arguments(cxx_flags UNIX_COMMAND "${CXX_FLAGS}")
  set(defines)
  if(package STREQUAL gdn-cuda)
    set(defines -DCONSUMER_CUDA)
  endif()
  step(${CXX} -std=c++20 ${cxx_flags} ${defines} ${CONSUMER_DIR}/main.cpp ${flags}
       -o ${WORK_DIR}/consumer_pkgconfig)
  step(${WORK_DIR}/consumer_pkgconfig)
endif()

step(${prefix}/bin/gdn --version)
