# Included by each packaging consumer twice. Before braid is brought in (BRAID_TEST_CUDA_STEP=enable):
# enables CUDA as a user's project would, where the parent build passed a CUDA compiler, and records
# the enabled languages. After (BRAID_TEST_CUDA_STEP=targets): checks that braid configured none of
# its own tests, bench or examples and enabled no language itself, and adds the consumers' one
# program ../main.cpp (consumer: the same for every way of bringing braid in), main.cu built with
# nvcc (consumer_cuda: C++20 must come from braid::braid, so no CUDA standard is set here; without a
# device it exits 77, skipped) and on the emulated device with the host compiler (consumer_emu: runs
# everywhere; only where the consumer sets BRAID_TEST_EMU, as one consumer is enough to show that
# braid::emu is exported and runs).
if(BRAID_TEST_CUDA_STEP STREQUAL "enable")
  if(BRAID_TEST_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER "${BRAID_TEST_CUDA_COMPILER}")
    set(CMAKE_CUDA_ARCHITECTURES "${BRAID_TEST_CUDA_ARCHITECTURES}")
    enable_language(CUDA)
  endif()
  get_property(_braid_test_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
  return()
endif()

if(TARGET braid_warnings OR TARGET braid_test_main)
  message(FATAL_ERROR "braid as a subproject configured its own tests/bench/examples")
endif()
get_property(_langs GLOBAL PROPERTY ENABLED_LANGUAGES)
if(NOT _langs STREQUAL _braid_test_langs)
  message(FATAL_ERROR "bringing in braid changed the enabled languages: ${_braid_test_langs} -> ${_langs}")
endif()

enable_testing()
add_executable(consumer "${CMAKE_CURRENT_LIST_DIR}/../main.cpp")
target_link_libraries(consumer PRIVATE braid::braid)
add_test(NAME consumer COMMAND consumer)
if(BRAID_TEST_CUDA_COMPILER)
  add_executable(consumer_cuda "${CMAKE_CURRENT_LIST_DIR}/main.cu")
  target_link_libraries(consumer_cuda PRIVATE braid::braid)
  add_test(NAME consumer_cuda COMMAND consumer_cuda)
  set_tests_properties(consumer_cuda PROPERTIES SKIP_RETURN_CODE 77)
endif()
if(BRAID_TEST_EMU)
  add_executable(consumer_emu "${CMAKE_CURRENT_LIST_DIR}/emu.cpp")
  target_link_libraries(consumer_emu PRIVATE braid::emu)
  add_test(NAME consumer_emu COMMAND consumer_emu)
endif()
