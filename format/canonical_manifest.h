// The fast path of parse_manifest (private to kvformat): accepts only a
// manifest in the exact canonical byte layout writers produce, valid in every
// field and rule; returns nullopt for anything else, so the general parser
// gives the verdict. A manifest it accepts is the one parse_manifest_json
// would return (format/canonical_manifest_test.cpp and the manifest fuzzer
// hold the two paths to that).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvtier/format/boundary_manifest.h"

namespace kvformat {

std::optional<BoundaryManifest> parse_canonical_manifest(std::string_view bytes);

// FORMAT.md 5's structure rules (manifest_inconsistent) on a manifest whose
// fields are valid and whose chain is not empty; both readers and the encoder
// apply them, so the two readers cannot drift apart on them.
Result<void> check_manifest_structure(const BoundaryManifest& m);

// A manifest checksum as stored: 8 lowercase hex digits.
std::string hex8(std::uint32_t v);

}  // namespace kvformat
