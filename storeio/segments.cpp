#include "segments.h"

namespace storeio {

std::optional<std::vector<kvformat::Segment>> to_segments(const kvtier_segment* entries,
                                                          std::uint32_t count) {
  std::vector<kvformat::Segment> out;
  out.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const kvtier_segment& e = entries[i];
    if (e.ndim > kvformat::kMaxNdim) return std::nullopt;
    kvformat::Segment s;
    s.layer = e.layer;
    // Out-of-enum values stay as they are: they compare unequal to any
    // parsed header's, and encode_header refuses them.
    s.kind = static_cast<kvformat::SegmentKind>(e.kind);
    s.dtype = static_cast<kvformat::DType>(e.dtype);
    s.offset = e.offset;
    s.length = e.length;
    s.shape.assign(e.shape, e.shape + e.ndim);
    s.stride.assign(e.stride, e.stride + e.ndim);
    s.part = e.part;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace storeio
