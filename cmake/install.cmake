# Installation and the exported package config. Included by the top-level CMakeLists.txt right after
# the `braid` INTERFACE target is defined, whether braid is the top-level project or a subproject
# (add_subdirectory, FetchContent). In a subproject the rules stay on by default: a parent that
# installs and exports its own targets linking braid::braid needs braid in an export set.
#
# Installed layout (prefix-relative, so the tree can be moved):
#   ${CMAKE_INSTALL_INCLUDEDIR}/braid/...                    the headers
#   ${CMAKE_INSTALL_DATAROOTDIR}/cmake/braid/braidTargets.cmake  braid::braid, braid::emu (INTERFACE, imported)
#   ${CMAKE_INSTALL_DATAROOTDIR}/cmake/braid/braidConfig.cmake   find_package(braid) entry point
#   ${CMAKE_INSTALL_DATAROOTDIR}/cmake/braid/braidConfigVersion.cmake
#   ${CMAKE_INSTALL_DATAROOTDIR}/cmake/braid/cuda-standard.cmake  C++20 for consumers' .cu files
# Header-only and architecture-independent, so the package lives under share/, not lib/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

option(BRAID_INSTALL "Generate braid's install rules and package config" ON)

if(BRAID_INSTALL)
  set(BRAID_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATAROOTDIR}/cmake/braid"
      CACHE STRING "Where braid's CMake package files are installed, relative to the prefix")
  mark_as_advanced(BRAID_INSTALL_CMAKEDIR)

  install(DIRECTORY "${braid_SOURCE_DIR}/include/braid"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")

  # The imported target needs <prefix>/${CMAKE_INSTALL_INCLUDEDIR}. It comes from the target's
  # $<INSTALL_INTERFACE:...> entry when that names a directory; that entry is empty when the target
  # was defined before GNUInstallDirs set CMAKE_INSTALL_INCLUDEDIR (a first configure), and then
  # INCLUDES DESTINATION supplies it instead (only then, so the path is not exported twice).
  get_target_property(_braid_incs braid INTERFACE_INCLUDE_DIRECTORIES)
  set(_braid_includes_destination)
  if(NOT "${_braid_incs}" MATCHES "\\$<INSTALL_INTERFACE:[^>]")
    set(_braid_includes_destination INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
  endif()
  install(TARGETS braid braid_emu EXPORT braidTargets ${_braid_includes_destination})
  unset(_braid_incs)
  unset(_braid_includes_destination)
  install(EXPORT braidTargets
          NAMESPACE braid::
          DESTINATION "${BRAID_INSTALL_CMAKEDIR}")

  configure_package_config_file(
    "${CMAKE_CURRENT_LIST_DIR}/braidConfig.cmake.in"
    "${braid_BINARY_DIR}/braidConfig.cmake"
    INSTALL_DESTINATION "${BRAID_INSTALL_CMAKEDIR}")
  # SameMajorVersion: any 0.x accepts a request for 0.y (CMake compares majors only).
  # ARCH_INDEPENDENT: a header-only package fits 32- and 64-bit consumers alike.
  write_basic_package_version_file(
    "${braid_BINARY_DIR}/braidConfigVersion.cmake"
    VERSION "${braid_VERSION}"
    COMPATIBILITY SameMajorVersion
    ARCH_INDEPENDENT)
  install(FILES
            "${braid_BINARY_DIR}/braidConfig.cmake"
            "${braid_BINARY_DIR}/braidConfigVersion.cmake"
            "${CMAKE_CURRENT_LIST_DIR}/cuda-standard.cmake"
          DESTINATION "${BRAID_INSTALL_CMAKEDIR}")
endif()
