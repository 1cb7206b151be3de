# Debian packages (CPack DEB), built by scripts/package or by `cpack -G DEB` in a build configured
# with -DCMAKE_INSTALL_PREFIX=/usr:
#   outboxd         outboxd and outboxctl (install component Runtime), the systemd units
#                   outboxd.service and outboxd@.service, /etc/outbox/outboxd.toml (a conffile,
#                   mode 0640 root:outbox), man pages, the reference configuration; a system user
#                   outbox made by its postinst (component Service; packaging/)
#   liboutbox-dev   headers, static libraries, the CMake package and the pkg-config files
#                   (component Development), its copyright and changelog (DevelopmentDocs)
# Service and DevelopmentDocs are EXCLUDE_FROM_ALL: a plain `cmake --install` (any prefix) never
# writes to /etc or the systemd directories; only CPack installs them, into its staging tree.
# Included at the end of the top CMakeLists.txt, after cmake/OutboxInstall.cmake (which computes
# OUTBOX_DEBIAN_DEV_DEPENDS).
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "Debian packages (cpack -G DEB, scripts/package): configure with "
                 "-DCMAKE_INSTALL_PREFIX=/usr (not ${CMAKE_INSTALL_PREFIX})")
endif()
if(BUILD_SHARED_LIBS)
  # The packages hold static libraries: shared ones would need a library package of their own
  # (liboutbox0.2, with shlibs and symbols files).
  message(STATUS "Debian packages: not with BUILD_SHARED_LIBS=ON (no CPackConfig.cmake)")
  return()
endif()

# The project's own address (the one its commits carry); a packager sets theirs.
set(OUTBOX_PACKAGE_MAINTAINER
    "outbox maintainers <maintainers@users.noreply.a-seed-28084c88.example>"
    CACHE STRING "Maintainer field of the Debian packages: Name <email>")
set(OUTBOX_PACKAGE_HOMEPAGE "" CACHE STRING "Homepage field of the Debian packages (empty: none)")

set(pkg_src ${PROJECT_SOURCE_DIR}/packaging)
set(pkg_out ${PROJECT_BINARY_DIR}/packaging)

# --- the outboxd package's own files (component Service) ------------------------------------------
# The units, from one template: outboxd.service (/etc/outbox/outboxd.toml) and outboxd@.service
# (/etc/outbox/%i.toml). ExecStart= names the installed outboxd.
set(OUTBOX_FULL_BINDIR ${CMAKE_INSTALL_FULL_BINDIR})
foreach(unit outboxd outboxd@)
  if(unit STREQUAL "outboxd")
    set(OUTBOX_UNIT_DESCRIPTION "outbox relay (outboxd)")
    set(OUTBOX_UNIT_CONFIG /etc/outbox/outboxd.toml)
    set(OUTBOX_UNIT_ENV /etc/outbox/outboxd.env)
    set(OUTBOX_UNIT_STATE outbox)
    set(OUTBOX_UNIT_EXAMPLE outboxd)
  else()
    set(OUTBOX_UNIT_DESCRIPTION "outbox relay (outboxd) %i")
    set(OUTBOX_UNIT_CONFIG /etc/outbox/%i.toml)
    set(OUTBOX_UNIT_ENV /etc/outbox/%i.env)
    set(OUTBOX_UNIT_STATE outbox/%i)
    set(OUTBOX_UNIT_EXAMPLE outboxd@NAME)
  endif()
  set(OUTBOX_UNIT_FILE ${unit}.service)
  configure_file(${pkg_src}/systemd/outboxd.service.in ${pkg_out}/${unit}.service @ONLY)
endforeach()

# Debian's changelog (native package: changelog.gz), dated like the version's entry in
# CHANGELOG.md ("## 0.2.0 (2026-11-25)"), else today. Compressed as Debian wants it (gzip -9n:
# maximal, no name or time stamp in the header).
file(STRINGS ${PROJECT_SOURCE_DIR}/CHANGELOG.md release_line
     REGEX "^## ${PROJECT_VERSION} \\([0-9]+-[0-9]+-[0-9]+\\)")
if(release_line MATCHES "\\(([0-9]+-[0-9]+-[0-9]+)\\)")
  set(release_date ${CMAKE_MATCH_1})
else()
  string(TIMESTAMP release_date "%Y-%m-%d" UTC)
endif()
execute_process(COMMAND date -u -R -d "${release_date} 12:00" OUTPUT_VARIABLE OUTBOX_PACKAGE_DATE
                OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
configure_file(${pkg_src}/debian/changelog.in ${pkg_out}/changelog @ONLY)
# _outbox_gzip(<source> <output>): at configure time, again when the source changes.
function(_outbox_gzip source output)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${source})
  execute_process(COMMAND gzip -9nc ${source} OUTPUT_FILE ${output} COMMAND_ERROR_IS_FATAL ANY)
endfunction()
_outbox_gzip(${pkg_out}/changelog ${pkg_out}/changelog.gz)

# Man pages outboxd(8) and outboxctl(1), made by help2man from the programs' own --help and
# --version (one text for both), with the sections help has no room for (SIGNALS, FILES, ...)
# from packaging/man/<program>.h2m; dated like the changelog (SOURCE_DATE_EPOCH) and gzip -9n,
# so the same tree makes the same pages. Built with the programs (target outbox_man_pages, in
# ALL) when help2man is there (scripts/install-deps tools); without it the packages cannot be
# made, and cpack says why.
execute_process(COMMAND date -u -d "${release_date} 12:00" +%s OUTPUT_VARIABLE release_epoch
                OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
find_program(OUTBOX_HELP2MAN help2man)
set(man_pages)
if(OUTBOX_HELP2MAN)
  foreach(page "outboxd|8|System Administration|the outbox relay: publishes committed outbox messages to brokers"
               "outboxctl|1|User Commands|inspect and repair an outbox (PostgreSQL or SQLite)")
    string(REPLACE "|" ";" page "${page}")
    list(GET page 0 program)
    list(GET page 1 section)
    list(GET page 2 manual)
    list(GET page 3 name)
    add_custom_command(
      OUTPUT ${pkg_out}/${program}.${section}.gz
      COMMAND ${CMAKE_COMMAND} -E env SOURCE_DATE_EPOCH=${release_epoch} ${OUTBOX_HELP2MAN}
              --no-info --section=${section} --manual=${manual}
              --source=outbox --name=${name} --include=${pkg_src}/man/${program}.h2m
              --output=${pkg_out}/${program}.${section} $<TARGET_FILE:${program}>
      COMMAND gzip -9nf ${pkg_out}/${program}.${section}
      DEPENDS ${program} ${pkg_src}/man/${program}.h2m
      COMMENT "help2man: ${program}(${section})"
      VERBATIM)
    list(APPEND man_pages ${pkg_out}/${program}.${section}.gz)
  endforeach()
  add_custom_target(outbox_man_pages ALL DEPENDS ${man_pages})
else()
  message(STATUS "Debian packages: no man pages without help2man (scripts/install-deps tools)")
  install(CODE "message(FATAL_ERROR \"outboxd's man pages need help2man: scripts/install-deps \"
                \"tools, then configure ${PROJECT_BINARY_DIR} again\")"
          COMPONENT Service EXCLUDE_FROM_ALL)
endif()

# Absolute destinations for what has a fixed place on a Debian system; the rest under the prefix.
install(FILES ${pkg_out}/outboxd.service ${pkg_out}/outboxd@.service
        DESTINATION /usr/lib/systemd/system COMPONENT Service EXCLUDE_FROM_ALL)
# 0644 in the package (as Debian wants a file in /etc), 0640 root:outbox from the postinst on: the
# file dpkg unpacks is always the package's default, which holds no secret.
install(FILES ${pkg_src}/debian/outboxd.toml DESTINATION /etc/outbox
        COMPONENT Service EXCLUDE_FROM_ALL)
if(OUTBOX_HELP2MAN)
  install(FILES ${pkg_out}/outboxd.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8
          COMPONENT Service EXCLUDE_FROM_ALL)
  install(FILES ${pkg_out}/outboxctl.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
          COMPONENT Service EXCLUDE_FROM_ALL)
endif()
install(FILES ${PROJECT_SOURCE_DIR}/apps/outboxd/outbox.example.toml
        DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/outboxd/examples
        COMPONENT Service EXCLUDE_FROM_ALL)
foreach(package_and_component outboxd|Service liboutbox-dev|DevelopmentDocs)
  string(REPLACE "|" ";" package_and_component ${package_and_component})
  list(GET package_and_component 0 package)
  list(GET package_and_component 1 component)
  install(FILES ${pkg_src}/debian/copyright ${pkg_out}/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${package}
          COMPONENT ${component} EXCLUDE_FROM_ALL)
endforeach()

# --- CPack ----------------------------------------------------------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME outbox)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${OUTBOX_PACKAGE_MAINTAINER}")
# Each package's synopsis is the first line of its CPACK_DEBIAN_<GROUP>_DESCRIPTION below; left
# defined, this one (the project's DESCRIPTION by default) would be put in front of both.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
# Release binaries carry no debug information; stripping removes the symbol tables (lintian).
set(CPACK_STRIP_FILES ON)
# The service component installs into /etc and /usr/lib/systemd: expected, not worth a warning.
set(CPACK_WARN_ON_ABSOLUTE_INSTALL_DESTINATION OFF)

set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Runtime Service Development DevelopmentDocs)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_COMPONENT_RUNTIME_GROUP outboxd)
set(CPACK_COMPONENT_SERVICE_GROUP outboxd)
set(CPACK_COMPONENT_DEVELOPMENT_GROUP dev)
set(CPACK_COMPONENT_DEVELOPMENTDOCS_GROUP dev)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SOURCE outbox)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${OUTBOX_PACKAGE_MAINTAINER}")
if(OUTBOX_PACKAGE_HOMEPAGE)
  set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${OUTBOX_PACKAGE_HOMEPAGE}")
endif()
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
# Depends: computed by dpkg-shlibdeps from the programs' shared libraries.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Maintainer scripts 0755, conffiles 0644, whatever their mode in the source tree.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_OUTBOXD_PACKAGE_NAME outboxd)
set(CPACK_DEBIAN_OUTBOXD_PACKAGE_SECTION net)
# adduser: the postinst makes the user outbox; the rest comes from shlibdeps.
set(CPACK_DEBIAN_OUTBOXD_PACKAGE_DEPENDS adduser)
set(CPACK_DEBIAN_OUTBOXD_PACKAGE_CONTROL_EXTRA
    ${pkg_src}/debian/conffiles ${pkg_src}/debian/postinst ${pkg_src}/debian/prerm
    ${pkg_src}/debian/postrm)
set(CPACK_DEBIAN_OUTBOXD_DESCRIPTION
    "transactional outbox relay (outboxd) and admin tool (outboxctl)
outbox lets a service write its events into an outbox table in the same
transaction as its business data (PostgreSQL or SQLite); outboxd publishes
them to RabbitMQ, Kafka, NATS JetStream, Redis Streams, HTTP webhooks or
files, with broker confirmations, retries and per-stream order, and outboxctl
inspects and repairs the outbox.
.
This package has both programs and the systemd units outboxd.service and
outboxd@.service (one relay per /etc/outbox/NAME.toml), which run as the
system user outbox. They are not enabled on installation.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME liboutbox-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# What find_package(outbox) and pkg-config need to link the static libraries: the -dev packages
# of the third-party libraries, from the table in cmake/OutboxInstall.cmake (dpkg-shlibdeps
# cannot see the dependencies of a static library).
list(JOIN OUTBOX_DEBIAN_DEV_DEPENDS ", " dev_depends)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "${dev_depends}")
set(CPACK_DEBIAN_DEV_DESCRIPTION
    "transactional outbox library for C++20 (development files)
outbox lets a service write its events into an outbox table in the same
transaction as its business data (PostgreSQL or SQLite), publish them with a
relay, and process them exactly once with an inbox.
.
This package has the headers, the static libraries, the CMake package
(find_package(outbox 0.2 COMPONENTS ...)) and the pkg-config files
(outbox-<component>.pc).")

include(CPack)
