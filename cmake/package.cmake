# cmake/package.cmake: installing brigade as a library. Included by the top
# CMakeLists.txt once the targets exist; it owns the install layout
#   bin/brigade, lib/libbrigade.so{,.MAJOR,.MAJOR.MINOR.PATCH}, lib/libbrigade.a,
#   include/brigade/*.h, lib/pkgconfig/brigade.pc,
#   lib/cmake/brigade/brigade{Config,ConfigVersion,Targets*}.cmake
# and the one translation of the modules' external dependencies (BG_DEPS)
# into what a consumer of libbrigade.a must link: the static target's link
# interface (in the build tree and installed), the find_dependency lines of
# brigadeConfig.cmake and brigade.pc's Requires.private / Libs.private.
# A dependency it does not know stops the configuration, so a new one cannot
# be left out of the package silently.
include(CMakePackageConfigHelpers)

set(BG_CONFIG_DEPS "")        # CMake code run by brigadeConfig.cmake
set(BG_PC_REQUIRES "")        # pkg-config modules (Requires.private)
set(BG_PC_LIBS "")            # linker flags (Libs.private)
set(BG_NEED_PKGCONFIG OFF)
set(BG_NEED_CUDA OFF)
foreach(d ${BG_DEPS})
  set(inst ${d})               # name in the installed link interface
  if(d MATCHES "^PkgConfig::(.+)$")
    set(prefix ${CMAKE_MATCH_1})
    set(mod ${${prefix}_MODULE_NAME})
    set(BG_NEED_PKGCONFIG ON)
    list(APPEND BG_PC_REQUIRES ${mod})
    string(APPEND BG_CONFIG_DEPS
      "if(NOT TARGET ${d})\n"
      "  pkg_check_modules(${prefix} QUIET IMPORTED_TARGET ${mod})\n"
      "  if(NOT ${prefix}_FOUND)\n"
      "    set(brigade_FOUND FALSE)\n"
      "    set(brigade_NOT_FOUND_MESSAGE \"brigade needs the pkg-config module ${mod}\")\n"
      "    return()\n"
      "  endif()\n"
      "endif()\n")
  elseif(d STREQUAL "OpenMP::OpenMP_C")
    foreach(n ${OpenMP_C_LIB_NAMES})
      list(APPEND BG_PC_LIBS -l${n})
    endforeach()
    # A C++-only consumer has no C compiler for FindOpenMP: the C++ runtime
    # library is the same one.
    string(APPEND BG_CONFIG_DEPS
      "if(NOT TARGET OpenMP::OpenMP_C)\n"
      "  get_property(_bg_langs GLOBAL PROPERTY ENABLED_LANGUAGES)\n"
      "  if(\"C\" IN_LIST _bg_langs)\n"
      "    find_dependency(OpenMP COMPONENTS C)\n"
      "  else()\n"
      "    find_dependency(OpenMP COMPONENTS CXX)\n"
      "    add_library(OpenMP::OpenMP_C INTERFACE IMPORTED)\n"
      "    set_property(TARGET OpenMP::OpenMP_C PROPERTY INTERFACE_LINK_LIBRARIES OpenMP::OpenMP_CXX)\n"
      "  endif()\n"
      "endif()\n")
  elseif(d STREQUAL "Threads::Threads")
    list(APPEND BG_PC_LIBS -pthread)
    string(APPEND BG_CONFIG_DEPS "find_dependency(Threads)\n")
  elseif(d MATCHES "^CUDA::(.+)$")
    set(BG_NEED_CUDA ON)
    list(APPEND BG_PC_LIBS -l${CMAKE_MATCH_1})
  elseif(IS_ABSOLUTE "${d}" AND d MATCHES "/lib([^/]+)\\.(so|a)$")
    # a library found by find_library (libnuma): linked by name once installed
    set(inst ${CMAKE_MATCH_1})
    list(APPEND BG_PC_LIBS -l${inst})
  elseif(d MATCHES "^[A-Za-z0-9_]+$")
    list(APPEND BG_PC_LIBS -l${d})      # m
  else()
    message(FATAL_ERROR "cmake/package.cmake: no rule to hand on the dependency '${d}' "
                        "to users of libbrigade.a; add one")
  endif()
  target_link_libraries(brigade_static PRIVATE "$<BUILD_INTERFACE:${d}>$<INSTALL_INTERFACE:${inst}>")
endforeach()
if(BG_NEED_CUDA)
  string(PREPEND BG_CONFIG_DEPS "find_dependency(CUDAToolkit)\n")
  list(PREPEND BG_PC_LIBS -L${CUDAToolkit_LIBRARY_DIR})
endif()
if(BG_NEED_PKGCONFIG)
  string(PREPEND BG_CONFIG_DEPS "find_dependency(PkgConfig)\n")
endif()
list(REMOVE_DUPLICATES BG_PC_LIBS)
list(JOIN BG_PC_REQUIRES " " BG_PC_REQUIRES)
list(JOIN BG_PC_LIBS " " BG_PC_LIBS)

# install
set(BG_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/brigade)
install(TARGETS brigade brigade_static EXPORT brigadeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/brigade DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
file(RELATIVE_PATH BG_BIN_TO_LIB /prefix/${CMAKE_INSTALL_BINDIR} /prefix/${CMAKE_INSTALL_LIBDIR})
set_target_properties(brigade_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${BG_BIN_TO_LIB}")
install(TARGETS brigade_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

install(EXPORT brigadeTargets NAMESPACE brigade:: DESTINATION ${BG_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/brigadeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/package/brigadeConfig.cmake
                              INSTALL_DESTINATION ${BG_CMAKE_DIR})
# 0.x: a minor release may break the API, so 0.1 does not satisfy a request for 0.2
# or the other way round; from 1.0 on, the same major version is compatible.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(BG_COMPAT SameMinorVersion)
else()
  set(BG_COMPAT SameMajorVersion)
endif()
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/brigadeConfigVersion.cmake
                                 COMPATIBILITY ${BG_COMPAT})
install(FILES ${PROJECT_BINARY_DIR}/package/brigadeConfig.cmake
              ${PROJECT_BINARY_DIR}/package/brigadeConfigVersion.cmake
        DESTINATION ${BG_CMAKE_DIR})

# brigade.pc finds its prefix from its own place (${pcfiledir}), so the same
# file serves any --prefix and a moved tree.
file(RELATIVE_PATH BG_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" BG_PC_TO_PREFIX "${BG_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/brigade.pc.in ${PROJECT_BINARY_DIR}/package/brigade.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/brigade.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
