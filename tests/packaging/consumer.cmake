# Driver for the packaging tests: cmake -D... -P consumer.cmake
#   MODE=install:  BUILD_TREE, PREFIX. Empties PREFIX, runs `cmake --install BUILD_TREE --prefix PREFIX`
#                  and checks the package files landed where find_package looks.
#   MODE=consumer: SOURCE (the consumer project), WORK (emptied first; the build tree is WORK/build),
#                  and one of PREFIX (find_package), BRAID_SOURCE_DIR (add_subdirectory) or
#                  PACK_FROM (tar CMakeLists.txt, cmake/ and include/ from there into
#                  WORK/braid-src.tar.gz, for FetchContent). Configures, builds, runs the consumer's
#                  CTest (which runs its executable).
# Common: GENERATOR, GENERATOR_PLATFORM, GENERATOR_TOOLSET, MAKE_PROGRAM, CXX_COMPILER, TOOLCHAIN_FILE,
#         CONFIG (the build configuration of the parent build; may be empty), CUDA_DIR (cuda/: main.cu
#         and steps.cmake), CUDA_COMPILER and CUDA_ARCHITECTURES (only where the parent has nvcc).
cmake_minimum_required(VERSION 3.21)

function(run)
  string(REPLACE ";" " " pretty "${ARGN}")
  message(STATUS "+ ${pretty}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${pretty}")
  endif()
endfunction()

set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()

if(MODE STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  run("${CMAKE_COMMAND}" --install "${BUILD_TREE}" --prefix "${PREFIX}" ${config_args})
  file(GLOB_RECURSE config_files "${PREFIX}/*/braidConfig.cmake")
  if(NOT config_files)
    message(FATAL_ERROR "no braidConfig.cmake under ${PREFIX}")
  endif()
  return()
endif()

if(NOT MODE STREQUAL "consumer")
  message(FATAL_ERROR "MODE must be install or consumer, not '${MODE}'")
endif()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

set(args -S "${SOURCE}" -B "${WORK}/build" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if(GENERATOR_PLATFORM)
  list(APPEND args -A "${GENERATOR_PLATFORM}")
endif()
if(GENERATOR_TOOLSET)
  list(APPEND args -T "${GENERATOR_TOOLSET}")
endif()
if(MAKE_PROGRAM)
  list(APPEND args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(TOOLCHAIN_FILE)
  list(APPEND args "-DCMAKE_TOOLCHAIN_FILE=${TOOLCHAIN_FILE}")
endif()
if(CONFIG)
  list(APPEND args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
list(APPEND args "-DBRAID_TEST_CUDA_DIR=${CUDA_DIR}")
if(CUDA_COMPILER)
  list(APPEND args "-DBRAID_TEST_CUDA_COMPILER=${CUDA_COMPILER}" "-DBRAID_TEST_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}")
endif()

if(PREFIX)
  list(APPEND args "-DCMAKE_PREFIX_PATH=${PREFIX}")
elseif(BRAID_SOURCE_DIR)
  list(APPEND args "-DBRAID_SOURCE_DIR=${BRAID_SOURCE_DIR}")
elseif(PACK_FROM)
  set(tarball "${WORK}/braid-src.tar.gz")
  # Inside a top folder, as release tarballs are; FetchContent strips it.
  file(COPY "${PACK_FROM}/CMakeLists.txt" "${PACK_FROM}/cmake" "${PACK_FROM}/include"
       DESTINATION "${WORK}/pack/braid-src")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E tar czf "${tarball}" braid-src
                  WORKING_DIRECTORY "${WORK}/pack" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "packing ${PACK_FROM} failed (${rc})")
  endif()
  file(SHA256 "${tarball}" sha)
  list(APPEND args "-DBRAID_URL=file://${tarball}" "-DBRAID_URL_HASH=SHA256=${sha}")
else()
  message(FATAL_ERROR "consumer mode needs PREFIX, BRAID_SOURCE_DIR or PACK_FROM")
endif()

run("${CMAKE_COMMAND}" ${args})
run("${CMAKE_COMMAND}" --build "${WORK}/build" ${config_args})
set(ctest_config)
if(CONFIG)
  set(ctest_config -C "${CONFIG}")
endif()
run("${CMAKE_CTEST_COMMAND}" --test-dir "${WORK}/build" --output-on-failure ${ctest_config})
