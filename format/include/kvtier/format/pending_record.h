// Pending record, format v1 (FORMAT.md section 9.1): the chunks a live writer
// has written or reused but not yet named in a published manifest. gc keeps
// them while the writer that listed them is alive.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvtier/format/format_error.h"

namespace kvformat {

inline constexpr std::string_view kPendingKind = "pending_chunks";
inline constexpr std::size_t kMaxPendingBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxPendingChunks = std::size_t{1} << 20;

struct PendingChunk {
  std::uint32_t group = 0;
  std::string key;  // lowercase hex
  auto operator<=>(const PendingChunk&) const = default;
};

// Canonical JSON, chunks sorted and each once.
Result<std::string> encode_pending_record(std::vector<PendingChunk> chunks);

// Reader order: strict JSON else bad_json; not an object or `format` missing
// or not an integer: bad_field; format != 1: unsupported_version; anything
// else wrong: bad_field.
Result<std::vector<PendingChunk>> parse_pending_record(std::string_view bytes);

}  // namespace kvformat
