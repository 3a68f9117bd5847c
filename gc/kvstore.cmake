# The kvstore CLI (verify, gc, stat, inspect): a library with all the logic
# (kvstorelib, linked by the tests and fuzzers) and a thin CLI on top. Needs
# the format codec (kvformat, from format.cmake); skipped without it so the
# tree stays configurable.
if(NOT TARGET kvformat)
  message(STATUS "kvstore: kvformat not defined, kvstore skipped")
  return()
endif()

set(KVSTORE_DIR ${CMAKE_CURRENT_LIST_DIR})
find_package(Threads REQUIRED)

add_library(kvstorelib STATIC
  ${KVSTORE_DIR}/atomic_file.cpp
  ${KVSTORE_DIR}/inventory.cpp
  ${KVSTORE_DIR}/lock.cpp
  ${KVSTORE_DIR}/mapped_crc.cpp
  ${KVSTORE_DIR}/plan.cpp
  ${KVSTORE_DIR}/progress.cpp
  ${KVSTORE_DIR}/report.cpp
  ${KVSTORE_DIR}/scan.cpp
  ${KVSTORE_DIR}/stat.cpp
  ${KVSTORE_DIR}/sweep.cpp
  ${KVSTORE_DIR}/walk.cpp
)
target_include_directories(kvstorelib PUBLIC ${KVSTORE_DIR})
target_link_libraries(kvstorelib PUBLIC kvformat fmt::fmt nlohmann_json::nlohmann_json Threads::Threads)

add_executable(kvstore ${KVSTORE_DIR}/kvstore_main.cpp)
target_link_libraries(kvstore PRIVATE kvstorelib CLI11::CLI11)

foreach(t walk_test mapped_crc_test lock_test plan_test sweep_test atomic_file_test scan_test)
  if(EXISTS ${KVSTORE_DIR}/${t}.cpp)
    add_executable(${t} ${KVSTORE_DIR}/${t}.cpp)
    target_link_libraries(${t} PRIVATE kvstorelib GTest::gtest_main)
    gtest_discover_tests(${t})
  endif()
endforeach()
