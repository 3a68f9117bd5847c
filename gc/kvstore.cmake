# The kvstore CLI (verify, gc, stat, inspect): a library with all the logic
# (kvstorelib, linked by the tests and fuzzers) and a thin CLI on top.
set(KVSTORE_LIB_SOURCES
  ${CMAKE_CURRENT_SOURCE_DIR}/atomic_file.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/lock.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/plan.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/progress.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/sweep.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/walk.cpp
)
set(KVSTORE_TESTS walk_test lock_test plan_test sweep_test atomic_file_test)

# The format-dependent parts need the codec library from format.cmake.
if(TARGET kvformat)
  list(APPEND KVSTORE_LIB_SOURCES
    ${CMAKE_CURRENT_SOURCE_DIR}/inventory.cpp
    ${CMAKE_CURRENT_SOURCE_DIR}/scan.cpp
    ${CMAKE_CURRENT_SOURCE_DIR}/verify.cpp
    ${CMAKE_CURRENT_SOURCE_DIR}/stat.cpp
    ${CMAKE_CURRENT_SOURCE_DIR}/report.cpp
  )
  list(APPEND KVSTORE_TESTS scan_test)
else()
  list(APPEND KVSTORE_LIB_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/inventory.cpp)
endif()

find_package(Threads REQUIRED)
add_library(kvstorelib STATIC ${KVSTORE_LIB_SOURCES})
target_include_directories(kvstorelib PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(kvstorelib PUBLIC fmt::fmt nlohmann_json::nlohmann_json Threads::Threads)
if(TARGET kvformat)
  target_link_libraries(kvstorelib PUBLIC kvformat)
  target_compile_definitions(kvstorelib PUBLIC KVSTORE_HAVE_FORMAT=1)

  add_executable(kvstore ${CMAKE_CURRENT_SOURCE_DIR}/kvstore_main.cpp)
  target_link_libraries(kvstore PRIVATE kvstorelib CLI11::CLI11)
endif()

foreach(t ${KVSTORE_TESTS})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${t}.cpp)
    add_executable(${t} ${CMAKE_CURRENT_SOURCE_DIR}/${t}.cpp)
    target_link_libraries(${t} PRIVATE kvstorelib GTest::gtest_main)
    gtest_discover_tests(${t})
  endif()
endforeach()
