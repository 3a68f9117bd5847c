# Precompiled headers for the targets of many files. CI builds the whole tree twice
# on two cores, plainly and under the sanitizers, and most of each compile was the
# same library headers parsed again: GoogleTest, nlohmann-json and fmt cost 1-2 s a
# file under the sanitizers. Each target below parses them once: the clang build
# (scripts/hardening.sh) took 229 s instead of 321 on the 2-core VM. Clang only: with
# GCC 12 the plain build gained 4 % and its headers warned (-Warray-bounds) once
# precompiled. A file still includes what it uses: -DKVTIER_PCH=OFF builds without.
option(KVTIER_PCH "Precompile the library headers of the larger targets (clang)" ON)
if(NOT KVTIER_PCH OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  return()
endif()

set(std <algorithm> <cstdint> <filesystem> <functional> <map> <memory> <optional> <string>
        <string_view> <system_error> <variant> <vector>)
set(json <nlohmann/json.hpp>)
set(gtest <gtest/gtest.h>)

target_precompile_headers(kvtier_common PRIVATE ${std})
target_precompile_headers(kvtier_common_test PRIVATE ${std} ${gtest})
foreach(t kvformat kvtier_storeio cxxscope_client)
  target_precompile_headers(${t} PRIVATE ${std} ${json})
endforeach()
foreach(t kvformat_test kvtier_storeio_test cxxscope_test)
  target_precompile_headers(${t} PRIVATE ${std} ${json} ${gtest})
endforeach()
foreach(t patcher kvstorelib)  # they format with fmt
  target_precompile_headers(${t} PRIVATE ${std} ${json} <fmt/format.h>)
endforeach()
target_precompile_headers(patcher_test PRIVATE ${std} ${json} <fmt/format.h> ${gtest})

# kvstore's one-file tests share one (their flags are the same; gc_plan_test's differ).
target_precompile_headers(walk_test PRIVATE ${std} ${json} <fmt/format.h> ${gtest})
foreach(t mapped_crc_test lock_test scan_test sweep_test atomic_file_test progress_test
          chunk_index_test store_perms_test)
  target_precompile_headers(${t} REUSE_FROM walk_test)
endforeach()
