# Common settings for every outbox target: warnings (errors by default), sanitizers on request.
set(OUTBOX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Woverloaded-virtual
    -Wimplicit-fallthrough
    # Designated initializers that leave members at their defaults are the intended idiom.
    -Wno-missing-field-initializers)
# GCC 12 reports memcpy overlaps of 2^63 bytes inside libstdc++'s std::string operator+ once -O3
# inlines it (GCC bug 105329, fixed in 13): a false positive in the standard library, not in this
# code, which broke every Release build with Debian 12's compiler.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  list(APPEND OUTBOX_WARNINGS -Wno-restrict)
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

# outbox_library(<part> SOURCES ... [DEPS ...] [PRIVATE_DEPS ...]) defines outbox_<part> and
# the alias outbox::<part>; public headers live in include/outbox/, shared by all parts.
function(outbox_library part)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(outbox_${part} ${ARG_SOURCES})
  add_library(outbox::${part} ALIAS outbox_${part})
  target_include_directories(outbox_${part}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
           $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(outbox_${part} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  outbox_target_defaults(outbox_${part})
endfunction()
