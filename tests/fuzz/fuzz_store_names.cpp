// Fuzzes the store's name parsers (kvtier/format/layout.h, FORMAT.md 2): rank
// base names, chunk paths, leaf directories, manifest and temp file names,
// hex. kvstore trusts these to decide what a file on disk is, so each accepted
// name must be exactly the one the writer would produce for the parsed
// values (no second spelling of the same chunk or manifest).
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kvtier/format/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  if (auto rb = kvformat::parse_rank_base_name(in)) {
    FUZZ_CHECK(rb->rank <= kvformat::kMaxRank);
    FUZZ_CHECK(rb->prefix + "_" + rb->model + "_" + rb->ns_short + "_r" + std::to_string(rb->rank) == in);
  }
  if (auto chunk = kvformat::parse_chunk_rel_path(in)) {
    auto rel = kvformat::chunk_rel_path(chunk->key, chunk->group);
    FUZZ_CHECK(rel.ok() && *rel == in);
    FUZZ_CHECK(in.find("..") == std::string_view::npos);
  }
  if (auto leaf = kvformat::parse_chunk_leaf_dir(in)) {
    FUZZ_CHECK(leaf->hh + "_g" + std::to_string(leaf->group) == in);
  }
  if (auto m = kvformat::parse_manifest_file_name(in)) {
    auto name = kvformat::manifest_file_name(m->boundary, m->tip);
    FUZZ_CHECK(name.ok() && *name == in);
  }
  if (auto t = kvformat::parse_temp_name(in)) {
    FUZZ_CHECK(kvformat::temp_name(t->final_name, t->pid, t->tid) == in);
  }
  if (auto bytes = kvformat::from_hex(in)) {
    FUZZ_CHECK(kvformat::to_hex(*bytes) == in);
  }
  if (kvformat::is_key_hex(in)) FUZZ_CHECK(in.size() % 2 == 0 && in.size() >= 16 && in.size() <= 128);
  return 0;
}
