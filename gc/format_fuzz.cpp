// libFuzzer entry: every parser must return a verdict (never crash, never read
// out of bounds, never disagree between whole-buffer and streaming reads).
// Seed corpus: tests/vectors/{chunk,manifest,record}.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "chunk_verifier.h"
#include "header.h"
#include "layout.h"
#include "manifest.h"
#include "namespace_record.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  auto whole = kvformat::verify_chunk(bytes);
  kvformat::ChunkVerifier streamed(size);
  kvformat::Result<void> step;
  for (std::size_t pos = 0; pos < size && step; pos += 97)
    step = streamed.update(bytes.subspan(pos, std::min<std::size_t>(97, size - pos)));
  auto fin = step ? streamed.finish() : kvformat::Result<kvformat::ChunkHeader>(step.error());
  if (whole.ok() != fin.ok() || (!whole.ok() && whole.error().reason != fin.error().reason))
    std::abort();
  if (whole) {
    auto again = kvformat::encode_header(*whole);
    if (!again || !std::equal(again->begin(), again->end(), data)) std::abort();
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto m = kvformat::parse_manifest(text); m) {
    auto again = kvformat::encode_manifest(*m);
    if (!again || !kvformat::parse_manifest(*again)) std::abort();
  }
  (void)kvformat::parse_namespace_record(text);
  (void)kvformat::parse_chunk_rel_path(text);
  (void)kvformat::parse_temp_name(text);
  (void)kvformat::parse_rank_base_name(text);
  (void)kvformat::parse_manifest_file_name(text);
  (void)kvformat::sanitize_model(text);
  return 0;
}
