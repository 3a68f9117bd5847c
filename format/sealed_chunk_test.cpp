#include "kvtier/format/sealed_chunk.h"

#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "kvtier/format/chunk_verifier.h"
#include "test_chunk_builder.h"
#include "test_temp_file.h"

namespace kvformat {
namespace {

using testing::make_chunk;
using testing::pattern_bytes;
using testing::state_header;
using testing::TempFile;

// A keyed store's file: the plain chunk with the flag set and 32 bytes where
// the MAC goes (not checked by these readers).
std::vector<std::uint8_t> sealed_of(std::vector<std::uint8_t> plain) {
  EXPECT_TRUE(set_chunk_flags(plain, kFlagMac));
  plain.resize(plain.size() + kMacSize, 0xAB);
  return plain;
}

TEST(SealedChunk, FlagSeenOnlyOnASealedFile) {
  const auto plain = make_chunk(state_header(), pattern_bytes(44, 1));
  const auto sealed = sealed_of(plain);
  TempFile p(plain), s(sealed);
  EXPECT_FALSE(is_sealed_fd(p.fd()));
  EXPECT_TRUE(is_sealed_fd(s.fd()));
  TempFile tiny(std::vector<std::uint8_t>(sealed.begin(), sealed.begin() + 11));
  EXPECT_FALSE(is_sealed_fd(tiny.fd())) << "too short to hold the flags";
  EXPECT_FALSE(is_sealed_fd(-1));
}

TEST(SealedChunk, HeaderIsThePlainOneItSeals) {
  const auto plain = make_chunk(state_header(5000), pattern_bytes(5044, 2));
  const auto sealed = sealed_of(plain);
  TempFile p(plain), s(sealed);
  auto h = read_sealed_header_fd(s.fd(), sealed.size());
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(*h, *read_chunk_header_fd(p.fd()));

  // The size is the caller's (fstat): one byte short of the file leaves no room for its MAC.
  auto shorter = read_sealed_header_fd(s.fd(), sealed.size() - 1);
  ASSERT_FALSE(shorter);
  EXPECT_EQ(shorter.error().reason, Reason::Truncated);
  auto io = read_sealed_header_fd(-1, sealed.size());
  ASSERT_FALSE(io);
  EXPECT_EQ(io.error().reason, Reason::IoError);
  EXPECT_EQ(io.error().message.rfind("read: ", 0), 0u) << io.error().message;
}

TEST(SealedChunk, PayloadChecksumInAnyBlockSize) {
  const auto plain = make_chunk(state_header(5000), pattern_bytes(5044, 2));
  auto sealed = sealed_of(plain);
  TempFile s(sealed);
  auto h = read_sealed_header_fd(s.fd(), sealed.size());
  ASSERT_TRUE(h);
  for (std::size_t block : {1ul, 1000ul, 5044ul, 1ul << 20}) {
    std::vector<std::uint8_t> buffer(block);
    auto r = verify_sealed_payload_fd(s.fd(), *h, buffer);
    ASSERT_TRUE(r) << block << ": " << r.error().message;
    EXPECT_EQ(*r, *h);
  }

  sealed[h->header_length() + 100] ^= 1;  // a payload byte; the MAC bytes are not read
  TempFile bad(sealed);
  std::vector<std::uint8_t> buffer(1000);
  auto r = verify_sealed_payload_fd(bad.fd(), *h, buffer);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, Reason::PayloadChecksumMismatch);
}

TEST(SealedChunk, ShrunkOrUnreadableFile) {
  const auto sealed = sealed_of(make_chunk(state_header(5000), pattern_bytes(5044, 2)));
  TempFile s(sealed);
  auto h = read_sealed_header_fd(s.fd(), sealed.size());
  ASSERT_TRUE(h);
  std::vector<std::uint8_t> buffer(1000);
  ASSERT_EQ(::ftruncate(s.fd(), static_cast<off_t>(h->header_length() + 10)), 0);
  auto shrank = verify_sealed_payload_fd(s.fd(), *h, buffer);
  ASSERT_FALSE(shrank);
  EXPECT_EQ(shrank.error().reason, Reason::Truncated);
  EXPECT_EQ(shrank.error().message, "file shrank while read");
  auto io = verify_sealed_payload_fd(-1, *h, buffer);
  ASSERT_FALSE(io);
  EXPECT_EQ(io.error().reason, Reason::IoError);
}

}  // namespace
}  // namespace kvformat
