// SHA-256 for the namespace hash (small and dependency-free on purpose: the
// codec must not pull in a crypto library for one digest of a few hundred bytes).
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace kvformat {

using Sha256Digest = std::array<std::uint8_t, 32>;

Sha256Digest sha256(std::span<const std::uint8_t> data);

}  // namespace kvformat
