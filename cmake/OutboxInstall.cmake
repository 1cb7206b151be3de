# What `cmake --install` puts under the prefix, besides the libraries and programs (installed where
# they are defined: outbox_library() and apps/): the public headers, the CMake package
# (find_package(outbox 0.2 COMPONENTS ...), lib/cmake/outbox) and one pkg-config file per library
# (outbox-<name>.pc, lib/pkgconfig). Included at the end of the top CMakeLists.txt, once every
# library exists. Tests, benchmarks, examples, fuzz targets and outbox-kafka-mock (a test tool)
# have no install rules.
include(CMakePackageConfigHelpers)

set(OUTBOX_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/outbox)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/outbox DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT Development FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/generated/outbox/core/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/outbox/core COMPONENT Development)

# How a user finds each third-party target the libraries link: with CMake (the config file) and
# with pkg-config. _outbox_dependency(<target> <find> <pc> <flags> [<deb>]) sets, in the caller:
#   <find>   cmake|<package>[|<version>|CONFIG]   find_dependency(<package> ...)
#            pkg|<prefix>|<module>                pkg_check_modules(<prefix> IMPORTED_TARGET <module>)
#   <pc>     the Debian pkg-config module, if there is one and linking needs it
#   <flags>  linker flags when there is none
#   <deb>    the Debian package that provides it to a user (the liboutbox-dev package depends on
#            it; cmake/OutboxPackage.cmake), with the version the find asks for
# Header-only libraries need no <pc> nor <flags>: their headers are in /usr/include. A library
# that links a target missing here fails the configuration, so that the package cannot silently
# lack it.
function(_outbox_dependency target find pc flags)
  set(f "")
  set(p "")
  set(l "")
  set(d "")
  if(target STREQUAL "Threads::Threads")
    set(f "cmake|Threads")
    set(l "-pthread")
    # libc6-dev: there wherever a C++ compiler is.
  elseif(target STREQUAL "PostgreSQL::PostgreSQL")
    set(f "cmake|PostgreSQL")
    set(p libpq)
    set(d libpq-dev)
  elseif(target STREQUAL "SQLite::SQLite3")
    set(f "cmake|SQLite3")
    set(p sqlite3)
    set(d libsqlite3-dev)
  elseif(target STREQUAL "rabbitmq::rabbitmq")
    set(f "cmake|rabbitmq-c|CONFIG")
    set(p librabbitmq)
    set(d librabbitmq-dev)
  elseif(target STREQUAL "CURL::libcurl")
    set(f "cmake|CURL")
    set(p libcurl)
    set(d "libcurl4-openssl-dev | libcurl-dev")
  elseif(target STREQUAL "OpenSSL::Crypto")
    set(f "cmake|OpenSSL")
    set(p libcrypto)
    set(d libssl-dev)
  elseif(target STREQUAL "nlohmann_json::nlohmann_json")
    set(f "cmake|nlohmann_json|3.11")
    set(d "nlohmann-json3-dev (>= 3.11)")
  elseif(target STREQUAL "toml11::toml11")
    set(f "cmake|toml11")
    set(d libtoml11-dev)
  elseif(target STREQUAL "Boost::headers")
    set(f "cmake|Boost|1.74")
    set(d "libboost-dev (>= 1.74)")
  elseif(target STREQUAL "PkgConfig::RDKAFKA")
    set(f "pkg|RDKAFKA|rdkafka")
    set(p rdkafka)
    set(d librdkafka-dev)
  elseif(target STREQUAL "PkgConfig::MariaDB")
    set(f "pkg|MariaDB|libmariadb")
    set(p libmariadb)
    set(d libmariadb-dev)
  elseif(target STREQUAL "PkgConfig::NATS")
    set(f "pkg|NATS|libnats")
    set(p libnats)
    set(d libnats-dev)
  elseif(target STREQUAL "ProtonCpp::ProtonCpp")
    # Found by our own module (installed beside the package); Debian's libqpid-proton-cpp.pc
    # requires modules it does not ship, so pkg-config users get the linker flags.
    set(f "cmake|ProtonCpp")
    set(l "-lqpid-proton-cpp -lqpid-proton")
    set(d libqpid-proton-cpp12-dev)
  elseif(target STREQUAL "PkgConfig::HIREDIS")
    set(f "pkg|HIREDIS|hiredis")
    set(p hiredis)
    set(d libhiredis-dev)
  else()
    message(FATAL_ERROR "An outbox library links ${target}: say in cmake/OutboxInstall.cmake "
                        "(_outbox_dependency) how its users find it.")
  endif()
  set(${find} "${f}" PARENT_SCOPE)
  set(${pc} "${p}" PARENT_SCOPE)
  set(${flags} "${l}" PARENT_SCOPE)
  if(ARGC GREATER 4)
    set(${ARGV4} "${d}" PARENT_SCOPE)
  endif()
endfunction()

get_property(outbox_libraries GLOBAL PROPERTY OUTBOX_LIBRARIES)

# _outbox_direct_deps(<library> <public> <private>): the targets a library links, aliases resolved
# (outbox::store -> outbox_store), split by visibility.
function(_outbox_direct_deps library public private)
  get_target_property(all ${library} LINK_LIBRARIES)
  get_target_property(interface ${library} INTERFACE_LINK_LIBRARIES)
  set(pub "")
  set(priv "")
  foreach(item IN LISTS all)
    if(item MATCHES "\\$<")
      message(FATAL_ERROR "${library} links '${item}': cmake/OutboxInstall.cmake does not know "
                          "how to export a generator expression.")
    endif()
    if(TARGET ${item})
      get_target_property(aliased ${item} ALIASED_TARGET)
      if(aliased)
        set(resolved ${aliased})
      else()
        set(resolved ${item})
      endif()
    elseif(item MATCHES "::")
      # A third-party imported target: visible only in the directory that found it.
      set(resolved ${item})
    else()
      message(FATAL_ERROR "${library} links '${item}', which is not a target: link a target, "
                          "so that the CMake package and the pkg-config files can name it.")
    endif()
    if(item IN_LIST interface)
      list(APPEND pub ${resolved})
    else()
      list(APPEND priv ${resolved})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES pub)
  list(REMOVE_DUPLICATES priv)
  if(pub)
    list(REMOVE_ITEM priv ${pub})
  endif()
  set(${public} "${pub}" PARENT_SCOPE)
  set(${private} "${priv}" PARENT_SCOPE)
endfunction()

# _outbox_closure(<library> <finds> <debs>): what find_package must find for a user to link
# <library>: the third-party packages of the library and of every outbox library under it, public
# and private alike (a static library's private dependencies are linked by its users; a shared
# library's are named in the exported targets for the linker's search path); <debs>: the Debian
# packages that provide them.
function(_outbox_closure library finds debs)
  set(pending ${library})
  set(seen "")
  set(result "")
  set(packages "")
  while(pending)
    list(POP_FRONT pending current)
    if(current IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${current})
    _outbox_direct_deps(${current} pub priv)
    foreach(dep IN LISTS pub priv)
      if(dep IN_LIST outbox_libraries)
        list(APPEND pending ${dep})
      else()
        _outbox_dependency(${dep} find pc flags deb)
        list(APPEND result "${find}")
        if(deb)
          list(APPEND packages "${deb}")
        endif()
        # A find through pkg-config (pkg|...) needs pkg-config itself.
        if(find MATCHES "^pkg\\|")
          list(APPEND packages "pkgconf | pkg-config")
        endif()
      endif()
    endforeach()
  endwhile()
  list(REMOVE_DUPLICATES result)
  list(REMOVE_DUPLICATES packages)
  set(${finds} "${result}" PARENT_SCOPE)
  set(${debs} "${packages}" PARENT_SCOPE)
endfunction()

# The way up from lib/pkgconfig to the prefix ("../.."), so that the .pc files move with it.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "outbox's pkg-config files are relocatable: CMAKE_INSTALL_LIBDIR and "
                      "CMAKE_INSTALL_INCLUDEDIR must be relative to the prefix.")
endif()
set(pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
cmake_path(NORMAL_PATH pc_dir)
string(REGEX REPLACE "[^/]+" ".." OUTBOX_PC_PREFIX_FROM_PCFILEDIR "${pc_dir}")

set(component_table "set(_outbox_components")
# The Debian packages a user of the installed libraries needs (all components): liboutbox-dev's
# Depends (cmake/OutboxPackage.cmake).
set(OUTBOX_DEBIAN_DEV_DEPENDS "")
set(component_needs "")
foreach(library IN LISTS outbox_libraries)
  get_target_property(name ${library} EXPORT_NAME)
  get_target_property(output ${library} OUTPUT_NAME)
  if(NOT output)
    set(output ${library})
  endif()
  string(APPEND component_table " ${name}")

  _outbox_closure(${library} finds debs)
  list(APPEND OUTBOX_DEBIAN_DEV_DEPENDS ${debs})
  list(JOIN finds "\" \"" finds_text)
  if(finds)
    string(APPEND component_needs "set(_outbox_needs_${name} \"${finds_text}\")\n")
  else()
    string(APPEND component_needs "set(_outbox_needs_${name} \"\")\n")
  endif()

  # pkg-config: outbox-<name>.pc. A shared library's private dependencies are Requires.private
  # and Libs.private; a static library's are needed to link it, so they are Requires and Libs,
  # and `pkg-config --libs` links it. (`pkg-config --static` would not: it also asks for the
  # private dependencies of Debian's libraries, e.g. libpq's -lgssapi_krb5 and -lldap, which
  # libpq-dev does not bring.)
  _outbox_direct_deps(${library} pub priv)
  set(requires "")
  set(requires_private "")
  set(libs "")
  set(libs_private "")
  foreach(visibility pub priv)
    foreach(dep IN LISTS ${visibility})
      if(dep IN_LIST outbox_libraries)
        get_target_property(dep_name ${dep} EXPORT_NAME)
        string(REPLACE "_" "-" dep_name ${dep_name})
        set(module "outbox-${dep_name} = ${PROJECT_VERSION}")
        set(flag "")
      else()
        _outbox_dependency(${dep} find module flag)
      endif()
      if(visibility STREQUAL "pub" OR NOT BUILD_SHARED_LIBS)
        list(APPEND requires ${module})
        list(APPEND libs ${flag})
      else()
        list(APPEND requires_private ${module})
        list(APPEND libs_private ${flag})
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES libs)
  list(REMOVE_DUPLICATES libs_private)
  list(JOIN requires ", " requires)
  list(JOIN requires_private ", " requires_private)
  list(JOIN libs " " libs)
  list(JOIN libs_private " " libs_private)
  set(OUTBOX_PC_REQUIRES "")
  if(requires)
    string(APPEND OUTBOX_PC_REQUIRES "Requires: ${requires}\n")
  endif()
  if(requires_private)
    string(APPEND OUTBOX_PC_REQUIRES "Requires.private: ${requires_private}\n")
  endif()
  if(libs)
    set(libs " ${libs}")
  endif()
  set(OUTBOX_PC_LIBS "Libs: -L\${libdir} -l${output}${libs}")
  if(libs_private)
    string(APPEND OUTBOX_PC_LIBS "\nLibs.private: ${libs_private}")
  endif()
  string(REPLACE "_" "-" OUTBOX_PC_NAME ${name})
  set(OUTBOX_PC_TARGET ${name})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/outbox.pc.in
                 ${PROJECT_BINARY_DIR}/pkgconfig/outbox-${OUTBOX_PC_NAME}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/outbox-${OUTBOX_PC_NAME}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT Development)
endforeach()
string(APPEND component_table ")\n")
list(REMOVE_DUPLICATES OUTBOX_DEBIAN_DEV_DEPENDS)
list(SORT OUTBOX_DEBIAN_DEV_DEPENDS)
set(OUTBOX_COMPONENT_TABLE "${component_table}${component_needs}")

install(EXPORT outboxTargets NAMESPACE outbox:: DESTINATION ${OUTBOX_CMAKE_DIR}
        FILE outboxTargets.cmake COMPONENT Development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/outboxConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/outboxConfig.cmake
                              INSTALL_DESTINATION ${OUTBOX_CMAKE_DIR})
# Until 1.0, a minor version may break the API: 0.2.x satisfies find_package(outbox 0.2), not 0.1
# nor 0.3.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/outboxConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/outboxConfig.cmake ${PROJECT_BINARY_DIR}/outboxConfigVersion.cmake
        ${PROJECT_SOURCE_DIR}/cmake/FindProtonCpp.cmake
        DESTINATION ${OUTBOX_CMAKE_DIR} COMPONENT Development)
