#include "crc_combine.h"

namespace storeio {
namespace {

// Appending n zero bytes to a message is a linear map on its CRC register
// over GF(2): a 32x32 bit matrix, one column a word. Squaring the matrix
// doubles n, so the map for length_b zero bytes takes log2(length_b)
// squarings; the CRC of a || b is then shift(crc_a) ^ crc_b.
std::uint32_t times(const std::uint32_t* matrix, std::uint32_t vector) {
  std::uint32_t sum = 0;
  for (; vector; vector >>= 1, ++matrix)
    if (vector & 1) sum ^= *matrix;
  return sum;
}

void square(std::uint32_t* out, const std::uint32_t* matrix) {
  for (int n = 0; n < 32; ++n) out[n] = times(matrix, matrix[n]);
}

}  // namespace

std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t length_b) {
  if (length_b == 0) return crc_a;
  std::uint32_t even[32];  // the map for 2^k zero bits, k even
  std::uint32_t odd[32];   // ... k odd
  odd[0] = 0xEDB88320u;    // one zero bit: the reflected polynomial
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  square(even, odd);  // two zero bits
  square(odd, even);  // four zero bits
  // Apply the maps for the set bits of length_b, in bytes (8 bits = 2^3).
  do {
    square(even, odd);
    if (length_b & 1) crc_a = times(even, crc_a);
    length_b >>= 1;
    if (length_b == 0) break;
    square(odd, even);
    if (length_b & 1) crc_a = times(odd, crc_a);
    length_b >>= 1;
  } while (length_b);
  return crc_a ^ crc_b;
}

}  // namespace storeio
