# Finds Apache Qpid Proton's C++ binding (Debian libqpid-proton-cpp12-dev) and the C library under
# it (libqpid-proton11-dev), as the imported target ProtonCpp::ProtonCpp. Debian ships no CMake
# package for them, and its libqpid-proton-cpp.pc requires pkg-config modules it does not ship
# (libqpid-proton-core, libqpid-proton-proactor), so the headers and libraries are looked up here.
#
#   find_package(ProtonCpp REQUIRED)
#   target_link_libraries(app PRIVATE ProtonCpp::ProtonCpp)
include(FindPackageHandleStandardArgs)

find_path(ProtonCpp_INCLUDE_DIR proton/container.hpp)
find_library(ProtonCpp_LIBRARY qpid-proton-cpp)
# The sink reads a rejected delivery's error condition with the C API (proton/disposition.h).
find_library(ProtonCpp_C_LIBRARY qpid-proton)
find_package_handle_standard_args(ProtonCpp
  REQUIRED_VARS ProtonCpp_LIBRARY ProtonCpp_C_LIBRARY ProtonCpp_INCLUDE_DIR)

if(ProtonCpp_FOUND AND NOT TARGET ProtonCpp::ProtonCpp)
  add_library(ProtonCpp::ProtonCpp UNKNOWN IMPORTED)
  set_target_properties(ProtonCpp::ProtonCpp PROPERTIES
    IMPORTED_LOCATION "${ProtonCpp_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ProtonCpp_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${ProtonCpp_C_LIBRARY}")
endif()
mark_as_advanced(ProtonCpp_INCLUDE_DIR ProtonCpp_LIBRARY ProtonCpp_C_LIBRARY)
