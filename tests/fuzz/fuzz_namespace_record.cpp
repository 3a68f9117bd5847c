// Fuzzes the namespace record parser (kvtier/format/namespace_record.h, FORMAT.md
// section 4) and, through it, the strict JSON reader and canonical JSON writer
// (kvtier/format/canonical_json.h) that the namespace hash is computed over.
//
// Properties: an accepted record has a namespace hash, re-encodes, and the
// encoding parses back to the same record with the same hash; encoding is
// idempotent (encode(parse(encode(r))) == encode(r)).
#include <cstdint>
#include <string_view>

#include "kvtier/format/canonical_json.h"
#include "fuzz_check.h"
#include "kvtier/format/namespace_record.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);

  // The strict reader on its own: whatever it accepts canonicalizes, and the
  // canonical form reads back to the same value.
  if (auto json = kvformat::parse_strict_json(in, kvformat::kMaxRecordBytes)) {
    if (auto canon = kvformat::canonical_json(*json)) {
      auto back = kvformat::parse_strict_json(*canon, kvformat::kMaxRecordBytes);
      FUZZ_CHECK(back.ok() && *back == *json);
    }
  }

  auto record = kvformat::parse_namespace_record(in);
  if (!record) return 0;
  FUZZ_CHECK(kvformat::check_fenced(record->fenced).ok());
  auto hash = kvformat::namespace_hash(record->fenced);
  FUZZ_CHECK(hash.ok());
  auto encoded = kvformat::encode_namespace_record(*record);
  FUZZ_CHECK(encoded.ok());
  auto again = kvformat::parse_namespace_record(*encoded);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->fenced == record->fenced && again->info == record->info);
  auto hash2 = kvformat::namespace_hash(again->fenced);
  FUZZ_CHECK(hash2.ok() && *hash2 == *hash);
  auto encoded2 = kvformat::encode_namespace_record(*again);
  FUZZ_CHECK(encoded2.ok() && *encoded2 == *encoded);
  return 0;
}
