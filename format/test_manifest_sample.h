// A small valid boundary manifest for the codec tests (test-only helper):
// chain a, b, c; full group 0 and state group 2.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/format/boundary_manifest.h"

namespace kvformat::testing {

inline std::string key(char c) { return std::string(32, c); }

inline BoundaryManifest sample_manifest() {
  BoundaryManifest m;
  m.ns = std::string(64, 'e');
  m.rank = 1;
  m.chunk_tokens = 16;
  m.chain = {key('a'), key('b'), key('c')};
  m.boundary = 48;
  m.groups = {
      {0, GroupKind::Full, {{key('a'), 100, 1}, {key('b'), 101, 2}, {key('c'), 102, 3}}},
      {2, GroupKind::State, {{key('c'), 44, 0xFFFFFFFF}}},
  };
  return m;
}

}  // namespace kvformat::testing
