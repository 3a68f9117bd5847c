// A property check for fuzz targets: a violated property is a finding, so it
// aborts (libFuzzer then saves the input as a crash reproducer). Not assert():
// it must hold in every build type, NDEBUG included.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: property violated: %s\n", __FILE__, __LINE__, \
                   #cond);                                                        \
      std::abort();                                                               \
    }                                                                             \
  } while (0)
