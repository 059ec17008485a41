# braid_cuda_launch: the collective kernels behind tests/cuda/launch.hpp's plain host functions, and
# the cross-process communicator behind launch_procs.hpp, compiled once and linked into test_gpu,
# test_gpu_procs and braid-bench (--backend cuda, bench/cuda_backend.cpp).
# Included from tests/cuda and from bench (which may be built without the tests); defined once.
if(NOT TARGET braid_cuda_launch)
  find_package(CUDAToolkit REQUIRED)
  set(_dir ${PROJECT_SOURCE_DIR}/tests/cuda)
  add_library(braid_cuda_launch OBJECT ${_dir}/launch_float.cu ${_dir}/launch_sum.cu ${_dir}/launch_procs.cu)
  target_link_libraries(braid_cuda_launch PUBLIC braid::braid CUDA::cudart)
  target_include_directories(braid_cuda_launch PUBLIC ${_dir})
  if(NOT "cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
    # CMake < 3.25.2: the top level already passes -std=c++20 in CMAKE_CUDA_FLAGS; CUDA_STANDARD would fail.
    set_property(TARGET braid_cuda_launch PROPERTY CUDA_STANDARD)
    set_property(TARGET braid_cuda_launch PROPERTY CUDA_STANDARD_REQUIRED)
  endif()
  # Line info for compute-sanitizer reports (no effect on the generated code).
  target_compile_options(braid_cuda_launch PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
endif()
