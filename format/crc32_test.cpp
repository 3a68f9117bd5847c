#include "kvtier/format/crc32.h"

#include <random>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#ifdef KVFORMAT_HAVE_ISAL
#include <isa-l/crc.h>
#endif

namespace kvformat {
namespace {

std::span<const std::uint8_t> bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

TEST(Crc32, CheckValueMatchesZlib) {
  // zlib.crc32(b"123456789") == 0xCBF43926 (the standard CRC-32 check value).
  EXPECT_EQ(crc32(bytes("123456789")), 0xCBF43926u);
  EXPECT_EQ(crc32_portable(bytes("123456789")), 0xCBF43926u);
  EXPECT_EQ(crc32(bytes("")), 0u);
  // zlib.crc32(b"The quick brown fox jumps over the lazy dog") == 0x414FA339
  EXPECT_EQ(crc32(bytes("The quick brown fox jumps over the lazy dog")), 0x414FA339u);
}

TEST(Crc32, ChainingEqualsOneShot) {
  const auto data = random_bytes(100000, 1);
  const std::uint32_t whole = crc32(data);
  for (std::size_t cut : {0ul, 1ul, 7ul, 8ul, 4095ul, 65536ul, 99999ul, 100000ul}) {
    const std::span<const std::uint8_t> all(data);
    EXPECT_EQ(crc32(all.subspan(cut), crc32(all.first(cut))), whole) << cut;
    EXPECT_EQ(crc32_portable(all.subspan(cut), crc32_portable(all.first(cut))), whole) << cut;
  }
}

TEST(Crc32, StreamingInOddBlocks) {
  const auto data = random_bytes(1 << 20, 2);
  Crc32 stream;
  std::size_t pos = 0, step = 1;
  while (pos < data.size()) {
    const std::size_t n = std::min(step, data.size() - pos);
    stream.update(std::span(data).subspan(pos, n));
    pos += n;
    step = step * 3 + 1;
  }
  EXPECT_EQ(stream.value(), crc32_portable(data));
}

TEST(Crc32, FallbackAgreesWithActiveImplementationOnManySizes) {
  for (std::size_t n = 0; n < 300; ++n) {
    const auto data = random_bytes(n, static_cast<std::uint32_t>(n));
    ASSERT_EQ(crc32(data), crc32_portable(data)) << n;
  }
  for (std::size_t n : {1023ul, 4096ul, 65537ul, 1ul << 20, (27ul << 20) + 13}) {
    const auto data = random_bytes(n, 7);
    ASSERT_EQ(crc32(data), crc32_portable(data)) << n;
  }
}

#ifdef KVFORMAT_HAVE_ISAL
TEST(Crc32, IsalGzipReflEqualsFallbackAndChains) {
  EXPECT_TRUE(crc32_uses_isal());
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    const std::size_t n = rng() % 20000;
    const std::uint32_t seed = i % 2 ? rng() : 0;
    const auto data = random_bytes(n, rng());
    ASSERT_EQ(crc32_gzip_refl(seed, data.data(), data.size()), crc32_portable(data, seed))
        << n << " seed " << seed;
  }
}
#else
TEST(Crc32, BuiltWithoutIsal) { EXPECT_FALSE(crc32_uses_isal()); }
#endif

}  // namespace
}  // namespace kvformat
