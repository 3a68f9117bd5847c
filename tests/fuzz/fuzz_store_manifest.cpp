// Fuzzes the boundary manifest parser (kvtier/format/boundary_manifest.h, FORMAT.md 5).
//
// A manifest carries a CRC-32 of its own canonical JSON, which random input
// almost never matches. So a JSON object input is tried twice: as is, and
// "fixed up" (its checksum recomputed, re-serialized canonically), which lets
// the fuzzer reach the field and consistency checks behind the checksum.
//
// Properties: an accepted manifest re-encodes, and the encoding parses back
// to the same manifest; a fixed-up input that is accepted is byte-identical
// to its re-encoding (the format is canonical JSON); parse_manifest (with its
// canonical-layout scanner) and parse_manifest_json (the JSON path alone)
// give the same verdict and the same manifest.
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kvtier/format/canonical_json.h"
#include "kvtier/format/crc32.h"
#include "fuzz_check.h"
#include "kvtier/format/boundary_manifest.h"

namespace {

void check_round_trip(std::string_view bytes, bool canonical_input) {
  auto m = kvformat::parse_manifest(bytes);
  auto general = kvformat::parse_manifest_json(bytes);
  FUZZ_CHECK(m.ok() == general.ok());
  if (!m) {
    FUZZ_CHECK(m.error().reason == general.error().reason);
    return;
  }
  FUZZ_CHECK(*m == *general);
  FUZZ_CHECK(!m->chain.empty());
  auto encoded = kvformat::encode_manifest(*m);
  FUZZ_CHECK(encoded.ok());
  auto again = kvformat::parse_manifest(*encoded);
  FUZZ_CHECK(again.ok() && *again == *m);
  if (canonical_input) FUZZ_CHECK(*encoded == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  check_round_trip(in, false);

  auto value = nlohmann::json::parse(in.begin(), in.end(), nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) return 0;
  value.erase("checksum");
  auto body = kvformat::canonical_json(value);
  if (!body) return 0;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x",
                kvformat::crc32(std::span<const std::uint8_t>(
                    reinterpret_cast<const std::uint8_t*>(body->data()), body->size())));
  value["checksum"] = hex;
  auto fixed = kvformat::canonical_json(value);
  if (!fixed) return 0;
  check_round_trip(*fixed, true);
  return 0;
}
