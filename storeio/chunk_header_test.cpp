// The chunk-header calls of the C ABI (store_abi.h, ABI 5): a header read
// from a path as format/ parses it, refused for what FORMAT.md 2 and 3.5
// refuse (a link, a FIFO, a missing, cut or longer file, a plain file where
// a keyed store holds sealed ones), parsed from bytes, and a keyed chunk
// opened under its MAC (wrong key, wrong rank, truncated, unsealed).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "kvtier/format/header.h"
#if KVTIER_STORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif
#include "kvtier/store_abi.h"
#include "test_chunk_builder.h"
#include "test_files.h"

namespace {

using kvformat::testing::make_chunk;
using kvformat::testing::pattern_bytes;
using kvformat::testing::state_header;
using storeio::testing::ScratchDir;
using storeio::testing::write_file;

struct Read {
  std::int32_t status = -1;
  std::string reason;
  std::string message;
  int sys_errno = 0;
  kvtier_chunk_header header{};
  std::vector<kvtier_segment> segments;
};

Read read_header(const std::string& path, std::uint32_t flags = 0, std::uint32_t capacity = 16) {
  Read out;
  out.segments.resize(capacity);
  kvtier_result r{};
  out.status = kvtier_read_chunk_header(path.c_str(), flags, &out.header, out.segments.data(),
                                        capacity, &r);
  out.reason = r.reason;
  out.message = r.message;
  out.sys_errno = r.sys_errno;
  EXPECT_EQ(r.data == nullptr || out.status == KVTIER_OK, true);
  kvtier_free(r.data);
  return out;
}

const std::vector<std::uint8_t> kFile = make_chunk(state_header(10), pattern_bytes(54, 1));

TEST(ChunkHeaderAbi, ReadGivesTheHeadersFields) {
  ScratchDir dir;
  write_file(dir.file("c.bin"), kFile);
  const Read got = read_header(dir.file("c.bin"));
  ASSERT_EQ(got.status, KVTIER_OK) << got.message;
  const kvformat::ChunkHeader want = *kvformat::verify_chunk(kFile);
  EXPECT_EQ(got.header.format_version, 2);
  EXPECT_EQ(got.header.group, want.group);
  EXPECT_EQ(got.header.boundary, want.boundary);
  EXPECT_EQ(got.header.payload_length, 54u);
  EXPECT_EQ(got.header.payload_checksum, want.payload_checksum);
  EXPECT_EQ(got.header.header_length, want.header_length());
  EXPECT_EQ(got.header.key_hash_length, 32);
  EXPECT_EQ(std::vector<std::uint8_t>(got.header.key_hash, got.header.key_hash + 32), want.key_hash);
  EXPECT_EQ(got.header.key_hash[32], 0);
  EXPECT_EQ(std::vector<std::uint8_t>(got.header.namespace_hash, got.header.namespace_hash + 32),
            std::vector<std::uint8_t>(want.namespace_hash.begin(), want.namespace_hash.end()));
  ASSERT_EQ(got.header.num_segments, 3u);
  EXPECT_EQ(got.segments[1].kind, 3);  // temporal
  EXPECT_EQ(got.segments[1].ndim, 3);
  EXPECT_EQ(got.segments[1].shape[2], 2u);
  EXPECT_EQ(got.segments[1].stride[0], 4u);
  EXPECT_EQ(got.segments[1].shape[3], 0u);
  EXPECT_EQ(got.segments[2].offset, 44u);
  // Less room than the table: the count says how much to ask for.
  const Read small = read_header(dir.file("c.bin"), 0, 1);
  ASSERT_EQ(small.status, KVTIER_OK);
  EXPECT_EQ(small.header.num_segments, 3u);
  EXPECT_EQ(small.segments[0].layer, 3u);
}

TEST(ChunkHeaderAbi, ReadRefusesWhatReadersRefuse) {
  ScratchDir dir;
  auto cut = kFile;
  cut.pop_back();
  write_file(dir.file("cut.bin"), cut);
  EXPECT_EQ(read_header(dir.file("cut.bin")).reason, "truncated");
  auto longer = kFile;
  longer.push_back(0);
  write_file(dir.file("long.bin"), longer);
  EXPECT_EQ(read_header(dir.file("long.bin")).reason, "trailing_bytes");
  auto flipped = kFile;
  flipped[30] ^= 1;
  write_file(dir.file("flip.bin"), flipped);
  const Read rot = read_header(dir.file("flip.bin"));
  EXPECT_EQ(rot.status, KVTIER_E_FORMAT);
  EXPECT_EQ(rot.reason, "header_checksum_mismatch");
  EXPECT_NE(rot.message.find(dir.file("flip.bin")), std::string::npos);  // names the file
  write_file(dir.file("empty.bin"), {});
  EXPECT_EQ(read_header(dir.file("empty.bin")).reason, "truncated");
  // The payload is not read: a flipped payload byte still reads.
  auto payload = kFile;
  payload.back() ^= 1;
  write_file(dir.file("payload.bin"), payload);
  EXPECT_EQ(read_header(dir.file("payload.bin")).status, KVTIER_OK);

  const Read missing = read_header(dir.file("none.bin"));
  EXPECT_EQ(missing.status, KVTIER_E_MISSING);
  EXPECT_EQ(missing.reason, "missing_file");
  write_file(dir.file("real.bin"), kFile);
  ASSERT_EQ(::symlink(dir.file("real.bin").c_str(), dir.file("link.bin").c_str()), 0);
  const Read link = read_header(dir.file("link.bin"));
  EXPECT_EQ(link.status, KVTIER_E_IO);
  EXPECT_EQ(link.sys_errno, ELOOP);
  ASSERT_EQ(::mkdir(dir.file("real").c_str(), 0700), 0);
  write_file(dir.file("real/c.bin"), kFile);
  ASSERT_EQ(::symlink(dir.file("real").c_str(), dir.file("folder").c_str()), 0);
  EXPECT_EQ(read_header(dir.file("folder/c.bin")).sys_errno, ELOOP);  // a link on the way
  ASSERT_EQ(::mkfifo(dir.file("fifo.bin").c_str(), 0600), 0);
  const Read fifo = read_header(dir.file("fifo.bin"));  // never blocks
  EXPECT_EQ(fifo.status, KVTIER_E_IO);
  EXPECT_EQ(fifo.sys_errno, EINVAL);
  EXPECT_EQ(read_header(dir.path()).sys_errno, EINVAL);

  kvtier_result r{};
  kvtier_chunk_header h{};
  EXPECT_EQ(kvtier_read_chunk_header(nullptr, 0, &h, nullptr, 0, &r), KVTIER_E_ARGUMENT);
  EXPECT_EQ(kvtier_read_chunk_header(dir.file("real.bin").c_str(), 0, nullptr, nullptr, 0, &r),
            KVTIER_E_ARGUMENT);
  EXPECT_EQ(kvtier_read_chunk_header(dir.file("real.bin").c_str(), 8, &h, nullptr, 0, &r),
            KVTIER_E_ARGUMENT);
  EXPECT_EQ(kvtier_read_chunk_header(dir.file("real.bin").c_str(), 0, &h, nullptr, 0, nullptr),
            KVTIER_E_ARGUMENT);
}

TEST(ChunkHeaderAbi, ParseFromBytes) {
  kvtier_chunk_header h{};
  std::vector<kvtier_segment> segs(4);
  kvtier_result r{};
  ASSERT_EQ(kvtier_parse_chunk_header(kFile.data(), kFile.size(), &h, segs.data(), 4, &r), KVTIER_OK);
  kvtier_free(r.data);
  EXPECT_EQ(h.num_segments, 3u);
  EXPECT_EQ(segs[2].length, 10u);
  // The size is not looked at: the header alone parses.
  ASSERT_EQ(kvtier_parse_chunk_header(kFile.data(), h.header_length, &h, segs.data(), 4, &r), KVTIER_OK);
  kvtier_free(r.data);
  EXPECT_EQ(kvtier_parse_chunk_header(kFile.data(), h.header_length - 1, &h, segs.data(), 4, &r),
            KVTIER_E_FORMAT);
  EXPECT_STREQ(r.reason, "truncated");
  EXPECT_EQ(kvtier_parse_chunk_header(kFile.data(), 0, &h, segs.data(), 4, &r), KVTIER_E_FORMAT);
  EXPECT_EQ(kvtier_parse_chunk_header(nullptr, 3, &h, segs.data(), 4, &r), KVTIER_E_ARGUMENT);
}

kvtier_chunk_header fields_of(const kvformat::ChunkHeader& h, std::vector<kvtier_segment>& segs) {
  kvtier_chunk_header out{};
  kvtier_result r{};
  const auto bytes = *kvformat::encode_header(h);
  segs.resize(h.segments.size());
  EXPECT_EQ(kvtier_parse_chunk_header(bytes.data(), bytes.size(), &out, segs.data(),
                                      static_cast<std::uint32_t>(segs.size()), &r),
            KVTIER_OK);
  kvtier_free(r.data);
  return out;
}

std::string encode_reason(const kvtier_chunk_header& h, const std::vector<kvtier_segment>& segs,
                          std::vector<std::uint8_t>* bytes = nullptr) {
  kvtier_result r{};
  const auto status = kvtier_encode_chunk_header(&h, segs.data(), &r);
  if (bytes && r.data) bytes->assign(r.data, r.data + r.length);
  kvtier_free(r.data);
  return status == KVTIER_OK ? "ok" : r.reason;
}

TEST(ChunkHeaderAbi, EncodeIsTheCodecsBytesAndRefusesWhatWouldNotParse) {
  const kvformat::ChunkHeader want = *kvformat::verify_chunk(kFile);
  std::vector<kvtier_segment> segs;
  const kvtier_chunk_header h = fields_of(want, segs);
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_reason(h, segs, &bytes), "ok");
  EXPECT_EQ(bytes, *kvformat::encode_header(want));
  const auto changed = [&](auto edit) {
    auto c = h;
    auto s = segs;
    edit(c, s);
    return encode_reason(c, s);
  };
  EXPECT_EQ(changed([](auto& c, auto&) { c.key_hash_length = 7; }), "bad_key_hash");
  EXPECT_EQ(changed([](auto& c, auto&) { c.key_hash_length = 65; }), "bad_key_hash");
  EXPECT_EQ(changed([](auto& c, auto&) { c.group = 1024; }), "field_out_of_range");
  EXPECT_EQ(changed([](auto& c, auto&) { c.payload_length = 55; }), "bad_segment_table");
  EXPECT_EQ(changed([](auto& c, auto&) { c.checksum_algorithm = 2; }),
            "unsupported_checksum_algorithm");
  EXPECT_EQ(changed([](auto& c, auto&) { c.format_version = 3; }), "unsupported_version");
  EXPECT_EQ(changed([](auto& c, auto& s) {
              c.format_version = 1;
              s[1].part = 1;
            }),
            "reserved_nonzero");
  EXPECT_EQ(changed([](auto&, auto& s) { s[0].ndim = 7; }), "bad_segment_table");
  EXPECT_EQ(changed([](auto& c, auto&) { c.num_segments = 0; }), "bad_segment_table");
  kvtier_result r{};
  EXPECT_EQ(kvtier_encode_chunk_header(nullptr, nullptr, &r), KVTIER_E_ARGUMENT);
  EXPECT_EQ(kvtier_encode_chunk_header(&h, nullptr, &r), KVTIER_E_ARGUMENT);
}

std::string verify_reason(const std::vector<std::uint8_t>& file, const std::vector<std::uint8_t>* key = nullptr,
                          std::uint32_t rank = 0) {
  kvtier_chunk_header h{};
  std::vector<kvtier_segment> segs(8);
  kvtier_result r{};
  const auto status = kvtier_verify_chunk(file.data(), file.size(), key ? key->data() : nullptr,
                                          key ? static_cast<std::uint32_t>(key->size()) : 0, rank, &h,
                                          segs.data(), 8, &r);
  kvtier_free(r.data);
  if (status == KVTIER_OK) {
    EXPECT_EQ(h.payload_length, 54u);
  }
  return status == KVTIER_OK ? "ok" : r.reason;
}

std::string verify_file_reason(const std::string& path, std::uint64_t block,
                               const std::vector<std::uint8_t>* key = nullptr, std::uint32_t rank = 0) {
  kvtier_chunk_header h{};
  std::vector<kvtier_segment> segs(8);
  kvtier_result r{};
  const auto status = kvtier_verify_chunk_file(path.c_str(), block, key ? key->data() : nullptr,
                                               key ? static_cast<std::uint32_t>(key->size()) : 0, rank,
                                               &h, segs.data(), 8, &r);
  kvtier_free(r.data);
  return status == KVTIER_OK ? "ok" : r.reason;
}

TEST(ChunkHeaderAbi, VerifyInMemoryAndFromAPath) {
  ScratchDir dir;
  EXPECT_EQ(verify_reason(kFile), "ok");
  auto flipped = kFile;
  flipped.back() ^= 1;
  EXPECT_EQ(verify_reason(flipped), "payload_checksum_mismatch");
  EXPECT_EQ(verify_reason({kFile.begin(), kFile.end() - 1}), "truncated");
  EXPECT_EQ(verify_reason({}), "truncated");
  write_file(dir.file("c.bin"), kFile);
  write_file(dir.file("bad.bin"), flipped);
  for (std::uint64_t block : {1, 100, 0}) {
    EXPECT_EQ(verify_file_reason(dir.file("c.bin"), block), "ok") << block;
    EXPECT_EQ(verify_file_reason(dir.file("bad.bin"), block), "payload_checksum_mismatch") << block;
  }
  EXPECT_EQ(verify_file_reason(dir.file("none.bin"), 0), "missing_file");
  ASSERT_EQ(::symlink(dir.file("c.bin").c_str(), dir.file("link.bin").c_str()), 0);
  EXPECT_EQ(verify_file_reason(dir.file("link.bin"), 0), "io_error");
}

#if KVTIER_STORE_HAVE_MAC
const std::vector<std::uint8_t> kKey(32, 0x5a);
const std::vector<std::uint8_t> kOtherKey(32, 0xa5);
constexpr std::uint32_t kRank = 5;
const kvformat::Salt kSalt{};

TEST(ChunkHeaderAbi, SealedFilesReadAsThePlainHeaderTheySeal) {
  ScratchDir dir;
  write_file(dir.file("sealed.bin"), kvformat::seal_chunk(kKey, kRank, kSalt, kFile));
  const Read got = read_header(dir.file("sealed.bin"), KVTIER_HEADER_SEALED);
  ASSERT_EQ(got.status, KVTIER_OK) << got.message;
  EXPECT_EQ(got.header.format_version, 2);
  EXPECT_EQ(got.header.payload_length, 54u);
  EXPECT_EQ(read_header(dir.file("sealed.bin")).reason, "unsupported_version");  // keyless: v3
  write_file(dir.file("plain.bin"), kFile);
  EXPECT_EQ(read_header(dir.file("plain.bin"), KVTIER_HEADER_SEALED).reason, "mac_missing");
  auto cut = kvformat::seal_chunk(kKey, kRank, kSalt, kFile);
  cut.resize(170);
  write_file(dir.file("cut.bin"), cut);
  EXPECT_EQ(read_header(dir.file("cut.bin"), KVTIER_HEADER_SEALED).reason, "truncated");
  auto rotten = kvformat::seal_chunk(kKey, kRank, kSalt, kFile);
  rotten[20] ^= 1;  // without the MAC, the header's own checksum tells
  write_file(dir.file("rot.bin"), rotten);
  EXPECT_EQ(read_header(dir.file("rot.bin"), KVTIER_HEADER_SEALED).reason, "header_checksum_mismatch");
}

struct Opened {
  std::int32_t status;
  std::string reason;
  std::vector<std::uint8_t> data;
};

Opened open_chunk(const std::vector<std::uint8_t>& file, const std::vector<std::uint8_t>& key,
                  std::uint32_t rank) {
  kvtier_result r{};
  const auto status = kvtier_open_chunk(file.data(), file.size(), key.data(),
                                        static_cast<std::uint32_t>(key.size()), rank, &r);
  Opened out{status, r.reason, r.data ? std::vector<std::uint8_t>(r.data, r.data + r.length)
                                      : std::vector<std::uint8_t>()};
  kvtier_free(r.data);
  return out;
}

TEST(ChunkHeaderAbi, OpenChunkChecksTheMacFirst) {
  const auto sealed = kvformat::seal_chunk(kKey, kRank, kSalt, kFile);
  const Opened ok = open_chunk(sealed, kKey, kRank);
  ASSERT_EQ(ok.status, KVTIER_OK) << ok.reason;
  EXPECT_EQ(ok.data, kFile);
  EXPECT_EQ(open_chunk(kvformat::seal_chunk_v2(kKey, kFile), kKey, 0).data, kFile);  // v2: no rank
  EXPECT_EQ(open_chunk(sealed, kOtherKey, kRank).reason, "mac_mismatch");
  EXPECT_EQ(open_chunk(sealed, kKey, kRank + 1).reason, "mac_mismatch");
  EXPECT_EQ(open_chunk(kFile, kKey, kRank).reason, "mac_missing");
  EXPECT_EQ(open_chunk({sealed.begin(), sealed.begin() + 170}, kKey, kRank).reason, "truncated");
  auto cut = sealed;
  cut.pop_back();
  EXPECT_EQ(open_chunk(cut, kKey, kRank).reason, "mac_mismatch");
  auto unknown = sealed;
  unknown[8] = 9;
  EXPECT_EQ(open_chunk(unknown, kKey, kRank).reason, "mac_mismatch");
  kvtier_result r{};
  EXPECT_EQ(kvtier_open_chunk(sealed.data(), sealed.size(), nullptr, 0, kRank, &r), KVTIER_E_ARGUMENT);
}
TEST(ChunkHeaderAbi, KeyedVerifyChecksTheMacThenTheChunk) {
  ScratchDir dir;
  const auto sealed = kvformat::seal_chunk(kKey, kRank, kSalt, kFile);
  EXPECT_EQ(verify_reason(sealed, &kKey, kRank), "ok");
  EXPECT_EQ(verify_reason(sealed, &kKey, kRank + 1), "mac_mismatch");
  EXPECT_EQ(verify_reason(sealed, &kOtherKey, kRank), "mac_mismatch");
  EXPECT_EQ(verify_reason(kFile, &kKey, kRank), "mac_missing");
  EXPECT_EQ(verify_reason(sealed), "unsupported_version");  // keyless: version 3
  write_file(dir.file("s.bin"), sealed);
  EXPECT_EQ(verify_file_reason(dir.file("s.bin"), 0, &kKey, kRank), "ok");
  EXPECT_EQ(verify_file_reason(dir.file("s.bin"), 0, &kKey, kRank + 1), "mac_mismatch");
  write_file(dir.file("cut.bin"), {sealed.begin(), sealed.begin() + 100});
  EXPECT_EQ(verify_file_reason(dir.file("cut.bin"), 0, &kKey, kRank), "truncated");
}

std::vector<std::uint8_t> seal(const std::vector<std::uint8_t>& chunk, const std::uint8_t* salt,
                               std::uint32_t flags, std::string* reason = nullptr) {
  kvtier_result r{};
  const auto status = kvtier_seal_chunk(chunk.data(), chunk.size(), kKey.data(),
                                        static_cast<std::uint32_t>(kKey.size()), kRank, salt, flags, &r);
  std::vector<std::uint8_t> out(r.data, r.data + r.length);
  if (reason) *reason = status == KVTIER_OK ? "ok" : r.reason;
  kvtier_free(r.data);
  return out;
}

TEST(ChunkHeaderAbi, SealIsTheCodecsSeal) {
  EXPECT_EQ(seal(kFile, kSalt.data(), 0), kvformat::seal_chunk(kKey, kRank, kSalt, kFile));
  EXPECT_EQ(seal(kFile, nullptr, KVTIER_SEAL_V2), kvformat::seal_chunk_v2(kKey, kFile));
  const auto a = seal(kFile, nullptr, 0), b = seal(kFile, nullptr, 0);
  EXPECT_NE(a, b);  // a fresh salt each time
  EXPECT_EQ(open_chunk(a, kKey, kRank).data, kFile);
  std::string reason;
  seal({kFile.begin(), kFile.begin() + 100}, nullptr, 0, &reason);
  EXPECT_EQ(reason, "bad_header_length");
  seal(kFile, nullptr, 4, &reason);
  EXPECT_EQ(reason, "bad_argument");
  kvtier_result r{};
  EXPECT_EQ(kvtier_seal_chunk(kFile.data(), kFile.size(), nullptr, 0, 0, nullptr, 0, &r),
            KVTIER_E_ARGUMENT);
}
#endif

}  // namespace
