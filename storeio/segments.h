// The ABI's segment entries as the codec's Segment values.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kvtier/format/header.h"
#include "kvtier/store_abi.h"

namespace storeio {

// nullopt when an entry has ndim > 6 (the caller's item is unusable).
std::optional<std::vector<kvformat::Segment>> to_segments(const kvtier_segment* entries,
                                                          std::uint32_t count);

}  // namespace storeio
