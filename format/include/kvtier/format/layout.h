// Names and relative paths of a rank's store (FORMAT.md section 2). Pure string
// functions: callers do the openat-style walking, these say what a name means.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/format/format_error.h"
#include "sha256.h"

namespace kvformat {

// The digest type of the shared SHA-256 (common/sha256.h).
using kvtier::Sha256Digest;

inline constexpr std::string_view kDefaultPrefix = "glm53kv";
inline constexpr std::string_view kManifestDir = "manifests";
inline constexpr std::string_view kLockFile = ".lock";
inline constexpr std::string_view kPendingDir = "pending";
inline constexpr std::size_t kModelNameMax = 64;
inline constexpr std::uint32_t kMaxRank = 65535;

std::string to_hex(std::span<const std::uint8_t> bytes);
Result<std::vector<std::uint8_t>> from_hex(std::string_view hex);

// Lowercase hex, even length, 16..128 digits (8..64 bytes).
bool is_key_hex(std::string_view text);

std::string sanitize_model(std::string_view model);

// <prefix>_<model>_<ns16>_r<rank>
Result<std::string> rank_base_name(std::string_view prefix, std::string_view model,
                                   const Sha256Digest& ns_hash, std::uint32_t rank);

struct RankBaseName {
  std::string prefix;
  std::string model;     // already sanitised
  std::string ns_short;  // 16 hex
  std::uint32_t rank = 0;
};
Result<RankBaseName> parse_rank_base_name(std::string_view name);

// <rank-base-name>.json, in the tier directory beside the rank base.
std::string namespace_record_name(std::string_view rank_base_name);

// <hhh>/<hh>_g<g>/<hash>.bin with hhh = hash[0:3], hh = hash[3:5].
Result<std::string> chunk_rel_path(std::string_view key_hex, std::uint32_t group);

struct ChunkName {
  std::string key;  // hex
  std::uint32_t group = 0;
};
// Inverse of chunk_rel_path (checks that hhh/hh agree with the hash).
Result<ChunkName> parse_chunk_rel_path(std::string_view rel);

// Pieces for a directory walker: "<hhh>" top directories, "<hh>_g<g>" leaf
// directories and "<hash>.bin" file names.
bool is_chunk_top_dir(std::string_view name);
struct LeafDir {
  std::string hh;
  std::uint32_t group = 0;
};
std::optional<LeafDir> parse_chunk_leaf_dir(std::string_view name);
// The key of "<hash>.bin" if it is one and it belongs under top/leaf.
std::optional<std::string> parse_chunk_file_name(std::string_view name,
                                                 std::string_view top,
                                                 std::string_view leaf_hh);

// b<boundary>_<tip>.json
Result<std::string> manifest_file_name(std::uint64_t boundary, std::string_view tip);
struct ManifestName {
  std::uint64_t boundary = 0;
  std::string tip;
};
Result<ManifestName> parse_manifest_file_name(std::string_view name);

// <pid>.<tid>.json in pending/: one writer's pending record (FORMAT.md 9.1).
// pid and tid are positive decimals of at most 19 digits.
Result<std::string> pending_file_name(std::uint64_t pid, std::uint64_t tid);
struct PendingName {
  std::uint64_t pid = 0;
  std::uint64_t tid = 0;
};
std::optional<PendingName> parse_pending_file_name(std::string_view name);

// <final>.tmp.<pid>.<tid>
std::string temp_name(std::string_view final_name, std::uint64_t pid, std::uint64_t tid);
struct TempName {
  std::string final_name;
  std::uint64_t pid = 0;
  std::uint64_t tid = 0;
};
std::optional<TempName> parse_temp_name(std::string_view name);

}  // namespace kvformat
