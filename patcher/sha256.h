// SHA-256 (FIPS 180-4), written here to keep the engine free of a crypto
// dependency: it only hashes file texts for pins and sentinels.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace patcher {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view data);
  std::string hex();  // finishes; 64 lowercase hex digits

 private:
  void block(const unsigned char* p);
  uint32_t h_[8];
  unsigned char buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::string_view data);

}  // namespace patcher
