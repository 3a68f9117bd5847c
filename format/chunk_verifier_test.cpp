#include "kvtier/format/chunk_verifier.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "test_chunk_builder.h"
#include "test_temp_file.h"

namespace kvformat {
namespace {

using testing::make_chunk;
using testing::pattern_bytes;
using testing::state_header;
using testing::TempFile;

std::string streamed(const std::vector<std::uint8_t>& file, std::size_t block) {
  ChunkVerifier v(file.size());
  for (std::size_t pos = 0; pos < file.size(); pos += block) {
    auto r = v.update(std::span(file).subspan(pos, std::min(block, file.size() - pos)));
    if (!r) return std::string(reason_name(r.error().reason));
  }
  auto h = v.finish();
  return h ? "ok" : std::string(reason_name(h.error().reason));
}

TEST(ChunkVerifier, BigChunkInAnyBlockSize) {
  // A 27 MiB chunk, the size of a real full-attention chunk.
  const std::size_t extra = (27u << 20) - 44;
  const auto file = make_chunk(state_header(extra), pattern_bytes(44 + extra, 3));
  for (std::size_t block : {4096ul, 65536ul, 1ul << 20, (1ul << 20) + 7, 8ul << 20, 64ul << 20})
    EXPECT_EQ(streamed(file, block), "ok") << block;
  auto bad = file;
  bad[bad.size() / 2] ^= 0x10;
  EXPECT_EQ(streamed(bad, 1u << 20), "payload_checksum_mismatch");
}

TEST(ChunkVerifier, AgreesWithWholeBufferOnEveryTruncation) {
  const auto file = make_chunk(state_header(), pattern_bytes(44, 1));
  for (std::size_t n = 0; n <= file.size(); ++n) {
    std::vector<std::uint8_t> cut(file.begin(), file.begin() + n);
    const std::string want = n == file.size() ? "ok" : "truncated";
    for (std::size_t block : {1ul, 13ul, 144ul, 1000ul}) ASSERT_EQ(streamed(cut, block), want) << n;
  }
}

TEST(ChunkVerifier, HeaderAvailableBeforeThePayloadEnds) {
  const auto file = make_chunk(state_header(1000), pattern_bytes(1044, 1));
  ChunkVerifier v(file.size());
  ASSERT_TRUE(v.update(std::span(file).first(600)));
  ASSERT_NE(v.header(), nullptr);
  EXPECT_EQ(v.header()->group, 2u);
  ASSERT_TRUE(v.update(std::span(file).subspan(600)));
  EXPECT_TRUE(v.finish());
}

TEST(ChunkVerifier, WrongSizeFailsBeforeThePayload) {
  const auto file = make_chunk(state_header(1000), pattern_bytes(1044, 1));
  ChunkVerifier shorter(file.size() - 1);
  auto r = shorter.update(std::span(file).first(file.size() - 1));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, Reason::Truncated);
  ChunkVerifier longer(file.size() + 1);
  auto r2 = longer.update(std::span(file).first(800));
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error().reason, Reason::TrailingBytes);
}

TEST(ChunkVerifier, MoreBytesThanAnnouncedIsAnIoError) {
  const auto file = make_chunk(state_header(), pattern_bytes(44, 1));
  ChunkVerifier v(10);
  auto r = v.update(file);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, Reason::IoError);
}

TEST(ChunkVerifier, FileDescriptorHelpers) {
  const auto file = make_chunk(state_header(5000), pattern_bytes(5044, 2));
  TempFile good(file);
  std::vector<std::uint8_t> buffer(1000);
  auto h = verify_chunk_fd(good.fd(), buffer);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(h->payload_length, 5044u);
  auto head = read_chunk_header_fd(good.fd());
  ASSERT_TRUE(head);
  EXPECT_EQ(*head, *h);

  auto bad_bytes = file;
  bad_bytes.back() ^= 1;
  TempFile bad(bad_bytes);
  auto r = verify_chunk_fd(bad.fd(), buffer);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, Reason::PayloadChecksumMismatch);
  EXPECT_TRUE(read_chunk_header_fd(bad.fd()));  // header-only read does not see it

  TempFile cut(std::vector<std::uint8_t>(file.begin(), file.end() - 1));
  auto t = read_chunk_header_fd(cut.fd());
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().reason, Reason::Truncated);

  auto io = verify_chunk_fd(-1, buffer);
  ASSERT_FALSE(io);
  EXPECT_EQ(io.error().reason, Reason::IoError);
}

TEST(ChunkVerifier, HeaderLongerThanTheFirstReadIsReadWhole) {
  // 600 segments: a header of 72,148 bytes, past read_head_fd's first 64 KiB.
  std::vector<SegmentSpec> specs;
  for (std::uint32_t layer = 0; layer < 600; ++layer)
    specs.push_back({layer, SegmentKind::Kv, DType::Uint8, {2}, {1}});
  ChunkHeader h = state_header();
  h.segments = make_segments(specs);
  const auto file = make_chunk(h, pattern_bytes(1200, 4));
  ASSERT_GT(header_length_for(600), 64u << 10);
  TempFile whole(file);
  auto head = read_chunk_header_fd(whole.fd());
  ASSERT_TRUE(head) << head.error().message;
  EXPECT_EQ(head->segments.size(), 600u);
  // Cut inside the header: truncated, as a read of the longest header says.
  TempFile cut(std::vector<std::uint8_t>(file.begin(), file.begin() + (70 << 10)));
  auto t = read_chunk_header_fd(cut.fd());
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().reason, Reason::Truncated);
}

}  // namespace
}  // namespace kvformat
