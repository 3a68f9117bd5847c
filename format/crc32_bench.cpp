// kvformat_crc_bench: CRC-32 throughput of the active implementation (ISA-L
// when the build found it) and of the portable fallback, over a buffer that
// stays in cache-sized and chunk-sized pieces. Prints figures; asserts nothing.
//
//   build/format/kvformat_crc_bench [MiB=256]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kvtier/format/crc32.h"

namespace {

double gib_per_s(std::uint32_t (*fn)(std::span<const std::uint8_t>, std::uint32_t),
                 const std::vector<std::uint8_t>& buf, std::size_t block, std::uint32_t& sink) {
  const auto start = std::chrono::steady_clock::now();
  std::uint32_t c = 0;
  for (std::size_t pos = 0; pos < buf.size(); pos += block)
    c = fn(std::span(buf).subspan(pos, std::min(block, buf.size() - pos)), c);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  sink ^= c;
  return static_cast<double>(buf.size()) / took.count() / (1u << 30);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  std::vector<std::uint8_t> buf(mib << 20);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::uint8_t>(i * 2654435761u >> 13);
  std::uint32_t sink = 0;
  std::printf("buffer %zu MiB, crc32 via %s\n", mib, kvformat::crc32_uses_isal() ? "ISA-L" : "fallback");
  for (std::size_t block : {std::size_t{1} << 20, std::size_t{8} << 20, std::size_t{27} << 20}) {
    const double active = gib_per_s(kvformat::crc32, buf, block, sink);
    const double portable = gib_per_s(kvformat::crc32_portable, buf, block, sink);
    std::printf("block %3zu MiB: active %6.2f GiB/s, portable %6.2f GiB/s\n", block >> 20, active,
                portable);
  }
  return sink == 0xFFFFFFFF ? 1 : 0;  // keeps the work observable
}
