// Builds small valid chunks for the codec tests (test-only helper).
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"

namespace kvformat::testing {

inline std::vector<std::uint8_t> pattern_bytes(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(i * 7 + seed * 13 + 3);
  return out;
}

// A state-group chunk: one layer split into conv (bf16 2x3) and temporal
// (f32 2x2x2) parts, then `extra` bytes of an opaque kv layer.
inline ChunkHeader state_header(std::uint64_t extra = 0) {
  std::vector<SegmentSpec> specs = {
      {3, SegmentKind::Conv, DType::BFloat16, {2, 3}, {3, 1}},
      {3, SegmentKind::Temporal, DType::Float32, {2, 2, 2}, {4, 2, 1}},
  };
  if (extra) specs.push_back({4, SegmentKind::Kv, DType::Uint8, {extra}, {1}});
  ChunkHeader h;
  for (std::size_t i = 0; i < h.namespace_hash.size(); ++i)
    h.namespace_hash[i] = static_cast<std::uint8_t>(0xA0 + i);
  h.group = 2;
  h.key_hash = pattern_bytes(32, 9);
  h.boundary = 3584;
  h.segments = make_segments(specs);
  h.payload_length = 44 + extra;
  return h;
}

inline std::vector<std::uint8_t> make_chunk(ChunkHeader h, const std::vector<std::uint8_t>& payload) {
  h.payload_length = payload.size();
  h.payload_checksum = crc32(payload);
  auto bytes = encode_header(h);
  std::vector<std::uint8_t> out = bytes ? *bytes : std::vector<std::uint8_t>{};
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

}  // namespace kvformat::testing
