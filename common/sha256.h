// SHA-256 (FIPS 180-4), written here so neither tool needs a crypto library:
// the engine hashes file texts for pins and sentinels, the store codec hashes
// a few hundred bytes for the namespace hash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvtier {

using Sha256Digest = std::array<std::uint8_t, 32>;

// Streaming form, for data that arrives in pieces.
class Sha256 {
 public:
  Sha256();
  void update(std::span<const std::uint8_t> data);
  void update(std::string_view data);
  Sha256Digest digest();  // finishes
  std::string hex();      // finishes; 64 lowercase hex digits

 private:
  void block(const std::uint8_t* p);
  std::uint32_t h_[8];
  std::uint8_t buf_[64];
  std::size_t buf_len_ = 0;
  std::uint64_t total_ = 0;
};

Sha256Digest sha256(std::span<const std::uint8_t> data);
std::string sha256_hex(std::string_view data);

}  // namespace kvtier
