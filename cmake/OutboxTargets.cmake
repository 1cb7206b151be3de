# GNUInstallDirs: where `cmake --install` puts things (CMAKE_INSTALL_LIBDIR, ...).
include(GNUInstallDirs)

# Common settings for every outbox target: warnings (errors by default), sanitizers on request.
set(OUTBOX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Woverloaded-virtual
    -Wimplicit-fallthrough
    # Designated initializers that leave members at their defaults are the intended idiom.
    -Wno-missing-field-initializers)
# GCC 12 reports memcpy overlaps of 2^63 bytes inside libstdc++'s std::string operator+ once -O3
# inlines it (GCC bug 105329, fixed in 13): a false positive in the standard library, not in this
# code, which broke every Release build with Debian 12's compiler.
# The same compiler at -O3 also reports the std::string inside a disengaged std::optional as "may be
# used uninitialized" where inlining happens to line up (GCC bug 80635): whether it fires depends
# on what else the file holds (adding a test to tests/postgres/pg_admin_test.cpp made two
# untouched tests warn). It stays a warning there, not an error.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  list(APPEND OUTBOX_WARNINGS -Wno-restrict -Wno-error=maybe-uninitialized)
endif()
if(OUTBOX_WERROR)
  list(APPEND OUTBOX_WARNINGS -Werror)
endif()

function(outbox_target_defaults target)
  target_compile_options(${target} PRIVATE ${OUTBOX_WARNINGS})
  if(OUTBOX_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# outbox_program_install(<target>): installs a program (outboxd, outboxctl) in bin/; with shared
# libraries, it finds them in the prefix's lib/ wherever the prefix is.
function(outbox_program_install target)
  if(BUILD_SHARED_LIBS)
    cmake_path(RELATIVE_PATH CMAKE_INSTALL_LIBDIR BASE_DIRECTORY ${CMAKE_INSTALL_BINDIR}
               OUTPUT_VARIABLE libdir_from_bindir)
    set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${libdir_from_bindir}")
  endif()
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)
endfunction()

# outbox_library(<part> [EXPORT_NAME <name>] SOURCES ... [DEPS ...] [PRIVATE_DEPS ...]) defines
# outbox_<part> and the alias outbox::<part>; public headers live in include/outbox/, shared by all
# parts. The library is installed and exported (cmake/OutboxInstall.cmake) as outbox::<name>
# (default: <part>), which is also an alias in the tree when it differs from <part>, so that a
# project that adds outbox as a subdirectory uses the installed names too.
function(outbox_library part)
  cmake_parse_arguments(ARG "" "EXPORT_NAME" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(NOT ARG_EXPORT_NAME)
    set(ARG_EXPORT_NAME ${part})
  endif()
  add_library(outbox_${part} ${ARG_SOURCES})
  add_library(outbox::${part} ALIAS outbox_${part})
  if(NOT ARG_EXPORT_NAME STREQUAL part)
    add_library(outbox::${ARG_EXPORT_NAME} ALIAS outbox_${part})
  endif()
  target_include_directories(outbox_${part}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
           $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  # The public headers are C++20: users get the standard with the target.
  target_compile_features(outbox_${part} PUBLIC cxx_std_20)
  target_link_libraries(outbox_${part} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  outbox_target_defaults(outbox_${part})
  # Shared libraries (BUILD_SHARED_LIBS=ON): until 1.0 every minor version may break the ABI, so
  # the soname carries major.minor (liboutbox_core.so.0.2).
  if(PROJECT_VERSION_MAJOR EQUAL 0)
    set(soversion ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  else()
    set(soversion ${PROJECT_VERSION_MAJOR})
  endif()
  set_target_properties(outbox_${part} PROPERTIES EXPORT_NAME ${ARG_EXPORT_NAME}
                        VERSION ${PROJECT_VERSION} SOVERSION ${soversion})
  # Installed shared libraries find each other in their own directory, wherever the prefix is.
  get_target_property(type outbox_${part} TYPE)
  if(type STREQUAL "SHARED_LIBRARY")
    set_target_properties(outbox_${part} PROPERTIES INSTALL_RPATH "$ORIGIN")
  endif()
  install(TARGETS outbox_${part} EXPORT outboxTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime NAMELINK_COMPONENT Development
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)
  set_property(GLOBAL APPEND PROPERTY OUTBOX_LIBRARIES outbox_${part})
endfunction()
