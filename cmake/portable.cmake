# KVTIER_PORTABLE=ON builds tools that need nothing from the system but glibc
# (the serving image's, which gets that image's security updates): libstdc++
# and libgcc are linked statically (cmake/install.cmake), and fmt (compiled
# in once, cmake/fmt_once.cpp) and toml++ (header-only) never load their
# Debian shared libraries: those load Debian's libstdc++.so.6, which needs
# glibc 2.36 (newer than Ubuntu 22.04's).
# Included before the find_package calls, which then find these targets.
option(KVTIER_PORTABLE "Static libstdc++/libgcc, fmt compiled in, header-only toml++, bundled ISA-L (for the serving image)" OFF)
if(NOT KVTIER_PORTABLE)
  return()
endif()

find_path(KVTIER_FMT_INCLUDE fmt/format-inl.h REQUIRED)
add_library(kvtier_fmt STATIC ${CMAKE_CURRENT_LIST_DIR}/fmt_once.cpp)
target_include_directories(kvtier_fmt SYSTEM PUBLIC ${KVTIER_FMT_INCLUDE})
set_target_properties(kvtier_fmt PROPERTIES POSITION_INDEPENDENT_CODE ON)
add_library(fmt::fmt ALIAS kvtier_fmt)

find_path(KVTIER_TOML_INCLUDE toml++/toml.h REQUIRED)
add_library(tomlplusplus::tomlplusplus INTERFACE IMPORTED)
set_target_properties(tomlplusplus::tomlplusplus PROPERTIES INTERFACE_COMPILE_DEFINITIONS TOML_HEADER_ONLY=1
                                                            INTERFACE_INCLUDE_DIRECTORIES ${KVTIER_TOML_INCLUDE})
