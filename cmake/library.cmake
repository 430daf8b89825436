# library.cmake - libtide as a package other programs link, included by the
# top CMakeLists.txt after the static `tide` target and cmake/cuda.cmake.
#
# Contract:
#   - tide_shared: libtide.so.MAJOR.MINOR.PATCH with SONAME libtide.so.MAJOR
#     (the numbers of include/tide.h), linked from the whole of libtide.a, so
#     that both libraries hold the very same objects (position-independent,
#     the CUDA backend's too where it is built). Only what include/tide.h
#     declares is exported (hidden visibility, tests/lib_symbols.sh checks).
#     The CLI, tests and benchmarks keep linking the static library, which
#     they reach into.
#   - `cmake --install` ships both libraries, tide.h, tide.pc (pkg-config:
#     Libs for the shared library, Requires.private/Libs.private for a static
#     link) and a CMake package: find_package(tide) gives tide::tide (the
#     shared library) and tide::tide_static, their dependencies found by
#     tideConfig.cmake.
include(CMakePackageConfigHelpers)

# A target needs a source of its own: an empty one (every object is libtide.a's).
set(_tide_shared_src ${CMAKE_CURRENT_BINARY_DIR}/tide_shared.c)
if(NOT EXISTS ${_tide_shared_src})
  file(WRITE ${_tide_shared_src} "/* libtide.so: its objects are libtide.a's (cmake/library.cmake). */\ntypedef int tide_shared_unit;\n")
endif()
add_library(tide_shared SHARED ${_tide_shared_src})
target_link_libraries(tide_shared PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,tide>")
target_include_directories(tide_shared PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# --no-undefined: every symbol the objects use is resolved by a library
# the .so names, so it loads into a program that links nothing else. (Not
# under a sanitizer, whose runtime the executable brings.)
if(NOT TIDE_SANITIZE)
  target_link_options(tide_shared PRIVATE -Wl,--no-undefined)
endif()
set_target_properties(tide_shared PROPERTIES
  OUTPUT_NAME tide EXPORT_NAME tide
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
set_target_properties(tide PROPERTIES EXPORT_NAME tide_static)

set(TIDE_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/tide)
install(TARGETS tide tide_shared EXPORT tideTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/tide.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tideTargets NAMESPACE tide:: DESTINATION ${TIDE_CMAKEDIR})

# tide.pc: the static link's flags. The pkg-config modules of the
# dependencies go to Requires.private; OpenMP, threads, libm (and the CUDA
# libraries) to Libs.private.
set(TIDE_PC_REQUIRES_PRIVATE "libcjson liburing openblas libpcre2-8 libutf8proc")
set(TIDE_PC_LIBS_PRIVATE "")
foreach(lib IN LISTS OpenMP_C_LIB_NAMES)
  string(APPEND TIDE_PC_LIBS_PRIVATE " -l${lib}")
endforeach()
string(APPEND TIDE_PC_LIBS_PRIVATE " -lpthread -lm")
set(TIDE_PKG_MPI ${TIDE_HAVE_MPI})
if(TIDE_HAVE_MPI)
  foreach(lib IN LISTS MPI_C_LIB_NAMES)
    string(APPEND TIDE_PC_LIBS_PRIVATE " -l${lib}")
  endforeach()
endif()
set(TIDE_PKG_CUDA OFF)
if(TIDE_CUDA AND TARGET CUDA::cudart)
  set(TIDE_PKG_CUDA ON)
  # the CUDA objects' host code is C++: a C linker needs libstdc++ named
  # (the build tree's programs link with the CUDA linker, which names it)
  target_link_libraries(tide INTERFACE $<INSTALL_INTERFACE:stdc++>)
  string(APPEND TIDE_PC_LIBS_PRIVATE
         " -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcublasLt -lcudart -lstdc++ -l${CMAKE_DL_LIBS}")
endif()
# NCCL (cmake/cuda.cmake): the CUDA ranks' collectives, in the static library too
if(TIDE_HAVE_NCCL)
  get_filename_component(_tide_nccl_dir ${TIDE_NCCL_LIBRARY} DIRECTORY)
  string(APPEND TIDE_PC_LIBS_PRIVATE " -L${_tide_nccl_dir} -lnccl")
endif()
string(STRIP "${TIDE_PC_LIBS_PRIVATE}" TIDE_PC_LIBS_PRIVATE)
configure_file(${PROJECT_SOURCE_DIR}/cmake/tide.pc.in ${CMAKE_CURRENT_BINARY_DIR}/tide.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tide.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tideConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/tideConfig.cmake INSTALL_DESTINATION ${TIDE_CMAKEDIR})
# 0.x: a minor version may break the ABI, so only the same minor matches.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tideConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tideConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/tideConfigVersion.cmake
        DESTINATION ${TIDE_CMAKEDIR})

if(TIDE_BUILD_TESTS)
  enable_testing()
  # the exported symbols and the SONAME (seconds)
  add_test(NAME lib_symbols COMMAND bash ${PROJECT_SOURCE_DIR}/tests/lib_symbols.sh
           $<TARGET_FILE:tide_shared> ${PROJECT_VERSION_MAJOR})
  set_tests_properties(lib_symbols PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60)
endif()

if(TIDE_BUILD_TESTS)
  # examples/generate.c built against the installed package (seconds)
  add_test(NAME lib_install COMMAND bash ${PROJECT_SOURCE_DIR}/tests/lib_install.sh
           $<TARGET_FILE:tide-cli> ${CMAKE_BINARY_DIR})
  set_tests_properties(lib_install PROPERTIES
    ENVIRONMENT "TIDE_FIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures;TIDE_DATA=${PROJECT_SOURCE_DIR}/data;TIDE_SANITIZE=${TIDE_SANITIZE}"
    SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
