// kvformat_mac_bench: what a keyed store's MAC costs a core beside the CRC-32
// every chunk already pays (docs/FORMAT.md 3.6): CRC-32, HMAC-SHA256 (the
// v2 seal), AES-GMAC (the v3 seal, subkey derivation included) and CRC-32 with
// each, over chunk-sized blocks (libcrypto). Prints figures; asserts nothing.
//
//   build/format/kvformat_mac_bench [MiB=256]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvtier/format/crc32.h"
#include "kvtier/format/mac.h"

namespace {

template <class Fn>
double gb_per_s(const std::vector<std::uint8_t>& buf, std::size_t block, Fn fn) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t pos = 0; pos < buf.size(); pos += block)
      fn(std::span(buf).subspan(pos, std::min(block, buf.size() - pos)));
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return static_cast<double>(buf.size()) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  std::vector<std::uint8_t> buf(mib << 20);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::uint8_t>(i * 2654435761u >> 13);
  const std::vector<std::uint8_t> key(32, 7);
  std::uint32_t sink = 0;
  std::printf("buffer %zu MiB, one thread, GB/s (1e9 bytes), crc32 via %s\n", mib,
              kvformat::crc32_uses_isal() ? "ISA-L" : "fallback");
  for (std::size_t block : {std::size_t{8} << 20, std::size_t{40} << 20}) {
    const double crc = gb_per_s(buf, block, [&](auto s) { sink ^= kvformat::crc32(s); });
    const double mac =
        gb_per_s(buf, block, [&](auto s) { sink ^= kvformat::hmac_sha256(key, s)[0]; });
    const double both = gb_per_s(buf, block, [&](auto s) {
      sink ^= kvformat::crc32(s) ^ kvformat::hmac_sha256(key, s)[0];
    });
    const kvformat::Salt salt{};
    auto gmac = [&](auto s) {
      kvformat::ChunkSealer sealer(key, 0, salt);
      sealer.update(s);
      return sealer.trailer()[31];
    };
    const double g = gb_per_s(buf, block, [&](auto s) { sink ^= gmac(s); });
    const double g_both = gb_per_s(buf, block, [&](auto s) { sink ^= kvformat::crc32(s) ^ gmac(s); });
    std::printf(
        "block %3zu MiB: crc32 %6.2f, hmac_sha256 %6.2f, crc32+hmac %6.2f, gmac %6.2f, "
        "crc32+gmac %6.2f\n",
        block >> 20, crc, mac, both, g, g_both);
  }
  return sink == 0xFFFFFFFF ? 1 : 0;  // keeps the work observable
}
