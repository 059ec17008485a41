# C++20 for a consumer's CUDA sources. `cxx_std_20` reaches only .cpp files: CMake gives a .cu file
# the CUDA standard, which it derives from `cuda_std_*` features, and CMake knows nvcc's C++20 flag
# only from 3.25.2 on (before, CMAKE_CUDA_STANDARD 20 adds no flag at all). So the running CMake
# decides: from 3.25.2 the `cuda_std_20` feature (CMake then picks the higher of it and the
# consumer's own CUDA standard); before, `-std=c++20` on CUDA compiles (a consumer's lower
# CMAKE_CUDA_STANDARD loses to it, with an nvcc warning). Either is inert for targets without CUDA
# sources.
#
# Called on braid's own target (build tree: add_subdirectory, FetchContent, braid's tests), wrapped
# in BUILD_INTERFACE so that it stays out of the exported target, and by the installed
# braidConfig.cmake on the imported one: the consumer's CMake, not the one that installed braid,
# makes the choice.
function(braid_require_cuda_cxx20 target)
  set(feature cuda_std_20)
  set(option $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  get_target_property(imported ${target} IMPORTED)
  if(NOT imported)
    set(feature $<BUILD_INTERFACE:${feature}>)
    set(option $<BUILD_INTERFACE:${option}>)
  endif()
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.25.2)
    target_compile_features(${target} INTERFACE ${feature})
  else()
    target_compile_options(${target} INTERFACE ${option})
  endif()
endfunction()
