# Format v1 codec (docs/FORMAT.md): the kvformat library that kvstore and the
# tests link, its gtest suite, and kvformat_vectors (writes/reads the shared
# test vectors so the Python suite can compare both codecs byte for byte).
set(KVFORMAT_DIR ${CMAKE_CURRENT_LIST_DIR})

add_library(kvformat STATIC
  ${KVFORMAT_DIR}/format_error.cpp
  ${KVFORMAT_DIR}/crc32.cpp
  ${KVFORMAT_DIR}/canonical_json.cpp
  ${KVFORMAT_DIR}/header.cpp
  ${KVFORMAT_DIR}/chunk_verifier.cpp
  ${KVFORMAT_DIR}/manifest.cpp
  ${KVFORMAT_DIR}/namespace_record.cpp
  ${KVFORMAT_DIR}/layout.cpp
  ${KVFORMAT_DIR}/retention.cpp
)
target_include_directories(kvformat PUBLIC ${KVFORMAT_DIR})
target_link_libraries(kvformat PUBLIC kvtier_common nlohmann_json::nlohmann_json)
if(TARGET PkgConfig::ISAL)
  target_link_libraries(kvformat PRIVATE PkgConfig::ISAL)
  target_compile_definitions(kvformat PRIVATE KVFORMAT_HAVE_ISAL=1)
  message(STATUS "kvformat: CRC-32 through ISA-L")
else()
  message(STATUS "kvformat: ISA-L not found, CRC-32 through the table fallback")
endif()

add_executable(kvformat_vectors ${KVFORMAT_DIR}/vectors_main.cpp ${KVFORMAT_DIR}/format_vectors.cpp)
target_link_libraries(kvformat_vectors PRIVATE kvformat)

add_executable(kvformat_test
  ${KVFORMAT_DIR}/crc32_test.cpp
  ${KVFORMAT_DIR}/canonical_json_test.cpp
  ${KVFORMAT_DIR}/header_test.cpp
  ${KVFORMAT_DIR}/chunk_verifier_test.cpp
  ${KVFORMAT_DIR}/manifest_test.cpp
  ${KVFORMAT_DIR}/namespace_record_test.cpp
  ${KVFORMAT_DIR}/layout_test.cpp
  ${KVFORMAT_DIR}/retention_test.cpp
  ${KVFORMAT_DIR}/vectors_test.cpp
  ${KVFORMAT_DIR}/format_vectors.cpp
)
target_link_libraries(kvformat_test PRIVATE kvformat GTest::gtest_main)
if(TARGET PkgConfig::ISAL)
  # The agreement test calls ISA-L directly and the portable fallback side by side.
  target_link_libraries(kvformat_test PRIVATE PkgConfig::ISAL)
  target_compile_definitions(kvformat_test PRIVATE KVFORMAT_HAVE_ISAL=1)
endif()
target_compile_definitions(kvformat_test PRIVATE
  KVFORMAT_VECTORS_DIR="${KVFORMAT_DIR}/../tests/vectors")
gtest_discover_tests(kvformat_test)

add_executable(kvformat_crc_bench ${KVFORMAT_DIR}/crc32_bench.cpp)
target_link_libraries(kvformat_crc_bench PRIVATE kvformat)

# Fuzz targets for these parsers live in tests/fuzz/ (KVTIER_FUZZ).
