# Installation and packaging (docs/DEPLOY.md): `cmake --install` lays out
#   bin/overlay, bin/kvstore
#   lib/kvtier/libkvtier_store.so                  the overlays' store library (storeio/)
#   share/kvtier/{anchors,overlays,docker}         the data the tools and scripts read
#   share/kvtier/pins/<engine>-<version>/          the pin sets (fixtures/)
#   share/bash-completion/completions/{overlay,kvstore}, share/zsh/site-functions/,
#   share/fish/vendor_completions.d/, share/man/man1/{overlay,kvstore}.1
#   share/doc/kvtier/                              README and docs
# and CPack turns the same rules into a .deb. `overlay` finds its anchors at
# <exe>/../share/kvtier/anchors, so an installed tree works from any prefix.
#
# KVTIER_PORTABLE=ON (the Docker builder, docker/build-tools.sh; see
# cmake/portable.cmake): libstdc++ and libgcc linked statically, and the one
# shared library left (ISA-L, plain C) installed into lib/kvtier with an
# $ORIGIN RPATH. Only glibc then comes from the system that runs the tools.
include(GNUInstallDirs)

set(KVTIER_TOOLS overlay kvstore)
foreach(t IN LISTS KVTIER_TOOLS)
  if(NOT TARGET ${t})
    message(FATAL_ERROR "install.cmake: target ${t} is not defined")
  endif()
endforeach()

set(KVTIER_DATADIR ${CMAKE_INSTALL_DATADIR}/kvtier)
set(KVTIER_BUNDLE_LIBDIR ${CMAKE_INSTALL_LIBDIR}/kvtier)

if(KVTIER_PORTABLE)
  foreach(t IN LISTS KVTIER_TOOLS)
    # --gc-sections drops the unused parts of libstdc++.a, among them
    # random_device's use of arc4random (glibc 2.36): the tools then need
    # glibc 2.35 (Ubuntu 22.04, the vLLM images' base).
    target_link_options(${t} PRIVATE -static-libstdc++ -static-libgcc -Wl,--gc-sections)
    file(RELATIVE_PATH _rel /${CMAKE_INSTALL_BINDIR} /${KVTIER_BUNDLE_LIBDIR})
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN/${_rel}")
  endforeach()
endif()
if(KVTIER_PORTABLE AND NOT SKBUILD)
  install(TARGETS ${KVTIER_TOOLS} RUNTIME_DEPENDENCY_SET kvtier_runtime_deps
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  # The overlays' store library (storeio/) beside the bundled ISA-L, which
  # its $ORIGIN RPATH finds; docker/bake.sh copies both beside native.py.
  install(TARGETS kvtier_store RUNTIME_DEPENDENCY_SET kvtier_runtime_deps
          LIBRARY DESTINATION ${KVTIER_BUNDLE_LIBDIR} COMPONENT runtime)
  # glibc (and its loader, libm, ...) stays the system's; everything else the
  # tools load is copied.
  install(RUNTIME_DEPENDENCY_SET kvtier_runtime_deps
          DESTINATION ${KVTIER_BUNDLE_LIBDIR} COMPONENT runtime
          PRE_EXCLUDE_REGEXES "^ld-linux" "^libc\\.so" "^libm\\.so" "^libpthread\\.so" "^libdl\\.so"
                              "^librt\\.so" "^libstdc\\+\\+\\.so" "^libgcc_s\\.so" "^linux-vdso")
else()
  install(TARGETS ${KVTIER_TOOLS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  install(TARGETS kvtier_store LIBRARY DESTINATION ${KVTIER_BUNDLE_LIBDIR} COMPONENT runtime)
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/anchors ${PROJECT_SOURCE_DIR}/overlays
        DESTINATION ${KVTIER_DATADIR} COMPONENT runtime
        PATTERN __pycache__ EXCLUDE PATTERN "*.pyc" EXCLUDE
        # the worked example of docs/OVERLAYS.md is not for a serving tree
        REGEX "/anchors/example-[^/]*$" EXCLUDE REGEX "/overlays/example-[^/]*$" EXCLUDE)
install(FILES ${PROJECT_SOURCE_DIR}/VERSION DESTINATION ${KVTIER_DATADIR} COMPONENT runtime)
# The pin sets (fixtures/<engine>-<version>/: PINS, WHEEL, ...), so an install
# can check a tree's files against them (docs/PORTING.md).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/fixtures/ DESTINATION ${KVTIER_DATADIR}/pins COMPONENT runtime
        FILES_MATCHING REGEX "/[^/]+-[^/]+/(PINS|WHEEL|SDIST|SOURCES|BUILT)$"
        PATTERN example EXCLUDE PATTERN __pycache__ EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docker/ DESTINATION ${KVTIER_DATADIR}/docker COMPONENT runtime
        FILES_MATCHING PATTERN "*.py" PATTERN "*.sh"
        PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
# The wheel (pyproject.toml; SKBUILD is set by scikit-build-core) installs
# into its kvtier/ package folder: the tools and their data, no docs or
# completions. `auditwheel repair` then copies ISA-L into kvtier.libs/.
# The store library (libkvtier_store.so) is installed above, in lib/kvtier/
# beside what the tools' RPATH names.
# An empty artifact list and bake record: the wheel's bake.sh (run with the
# engine's python) writes both in place, and pip, which removes exactly the
# files a wheel's RECORD lists, then removes them on `pip uninstall kvtier`.
# Empty means "not baked yet": the gate and launch.sh say so.
if(SKBUILD)
  foreach(f ARTIFACTS.sha256 ARTIFACTS.baked)
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/wheel-placeholder/${f} "")
    install(FILES ${CMAKE_CURRENT_BINARY_DIR}/wheel-placeholder/${f} DESTINATION ${KVTIER_DATADIR} COMPONENT runtime)
  endforeach()
  return()
endif()
install(FILES ${PROJECT_SOURCE_DIR}/packaging/bash-completion/overlay ${PROJECT_SOURCE_DIR}/packaging/bash-completion/kvstore
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions COMPONENT runtime)
# zsh and fish completion and the man pages: generated from the tools' --help
# by packaging/gen-cli-docs.py and committed (tests/python/packaging/test_cli_docs.py
# fails when they are stale). zsh reads $prefix/share/zsh/site-functions,
# fish $prefix/share/fish/vendor_completions.d.
install(FILES ${PROJECT_SOURCE_DIR}/packaging/zsh/_overlay ${PROJECT_SOURCE_DIR}/packaging/zsh/_kvstore
        DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/site-functions COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/fish/overlay.fish ${PROJECT_SOURCE_DIR}/packaging/fish/kvstore.fish
        DESTINATION ${CMAKE_INSTALL_DATADIR}/fish/vendor_completions.d COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/packaging/man/overlay.1 ${PROJECT_SOURCE_DIR}/packaging/man/kvstore.1
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT runtime)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/packaging/deploy/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT runtime)

# CPack: `cpack -G DEB` in the build folder writes kvtier_<version>_<arch>.deb.
# Only the runtime component goes in (the test binaries are never installed).
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VENDOR "kvtier")
set(CPACK_PACKAGE_CONTACT "kvtier maintainers <kvtier@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "fail-closed overlays for a pinned vLLM, and the kvstore tool for its KV disk tier")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Only the runtime component: cpack then needs just `overlay` and `kvstore`
# built (other folders' install rules, e.g. the clang scope tool, stay out).
set(CPACK_INSTALL_CMAKE_PROJECTS "${CMAKE_BINARY_DIR};kvtier;runtime;/")
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # Depends: from the libraries the tools load
set(CPACK_DEBIAN_PACKAGE_DEPENDS "bash, python3")  # the scripts; python3 runs the knob rules
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
include(CPack)
