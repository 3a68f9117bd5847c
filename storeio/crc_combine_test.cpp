#include "crc_combine.h"

#include <gtest/gtest.h>

#include <vector>

#include "kvtier/format/crc32.h"

namespace {

TEST(Crc32Combine, EqualsTheCrcOfTheConcatenation) {
  std::vector<std::uint8_t> data(300000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 131 + 7);
  const std::uint32_t whole = kvformat::crc32(data);
  for (const std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{4095},
                                std::size_t{65536}, data.size() - 1, data.size()}) {
    const std::span<const std::uint8_t> all(data);
    const auto a = kvformat::crc32(all.first(cut));
    const auto b = kvformat::crc32(all.subspan(cut));
    EXPECT_EQ(storeio::crc32_combine(a, b, data.size() - cut), whole) << cut;
  }
}

TEST(Crc32Combine, ManyPiecesInOrder) {
  std::vector<std::uint8_t> data(1 << 20);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i ^ (i >> 9));
  const std::span<const std::uint8_t> all(data);
  std::uint32_t crc = 0;
  for (std::size_t at = 0; at < data.size(); at += 77777) {
    const auto piece = all.subspan(at, std::min<std::size_t>(77777, data.size() - at));
    crc = storeio::crc32_combine(crc, kvformat::crc32(piece), piece.size());
  }
  EXPECT_EQ(crc, kvformat::crc32(data));
}

}  // namespace
