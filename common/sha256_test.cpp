#include "sha256.h"

#include <string>

#include <gtest/gtest.h>

namespace kvtier {
namespace {

// The digest form, hex-encoded here so the test needs nothing but sha256.h.
std::string hex_sha(const std::string& s) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::uint8_t b : sha256({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()})) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, KnownAnswersThroughTheDigestForm) {
  EXPECT_EQ(hex_sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex_sha(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, MillionAsAndChunkedUpdatesAgree) {
  std::string a(1000000, 'a');
  EXPECT_EQ(sha256_hex(a), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Sha256 s;
  for (size_t i = 0; i < a.size(); i += 37) s.update(std::string_view(a).substr(i, 37));
  EXPECT_EQ(s.hex(), sha256_hex(a));
}

TEST(Sha256, PaddingBoundaries) {
  // 55, 56 and 64 bytes straddle the one-block/two-block padding split;
  // values from Python hashlib.sha256(b"a" * n).
  EXPECT_EQ(hex_sha(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(hex_sha(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(hex_sha(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, EveryLengthAroundTheBlockBoundary) {
  // Lengths 55..65 exercise one- and two-block padding; compare to chunked.
  for (size_t n = 50; n < 70; ++n) {
    std::string s(n, 'x');
    Sha256 h;
    h.update(std::string_view(s).substr(0, n / 2));
    h.update(std::string_view(s).substr(n / 2));
    EXPECT_EQ(h.hex(), sha256_hex(s)) << n;
  }
  EXPECT_EQ(sha256_hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

}  // namespace
}  // namespace kvtier
