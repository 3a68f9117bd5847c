#include "kvtier/format/pending_record.h"

#include <gtest/gtest.h>

namespace kvformat {
namespace {

const std::string kA(32, 'a'), kB(32, 'b');

std::string verdict(std::string_view text) {
  auto r = parse_pending_record(text);
  return r ? "ok" : std::string(reason_name(r.error().reason));
}

std::string record(std::string_view chunks) {
  return "{\"chunks\":[" + std::string(chunks) + "],\"format\":1,\"kind\":\"pending_chunks\"}";
}

TEST(PendingRecord, EncodeSortsAndDeduplicates) {
  auto text = encode_pending_record({{2, kA}, {0, kB}, {0, kA}, {0, kB}});
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, record("[0,\"" + kA + "\"],[0,\"" + kB + "\"],[2,\"" + kA + "\"]"));
  auto back = parse_pending_record(*text);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->size(), 3u);
}

// FORMAT.md 9.1 says "sorted, each once": the reader holds writers to it
// (issue 37: neither codec checked).
TEST(PendingRecord, UnsortedOrRepeatedChunksAreBadField) {
  EXPECT_EQ(verdict(record("[0,\"" + kA + "\"],[0,\"" + kB + "\"]")), "ok");
  EXPECT_EQ(verdict(record("[2,\"" + kA + "\"],[0,\"" + kB + "\"]")), "bad_field");
  EXPECT_EQ(verdict(record("[0,\"" + kB + "\"],[0,\"" + kA + "\"]")), "bad_field");
  EXPECT_EQ(verdict(record("[0,\"" + kA + "\"],[0,\"" + kA + "\"]")), "bad_field");
}

TEST(PendingRecord, NulThenJunkIsBadJson) {
  using namespace std::string_literals;
  EXPECT_EQ(verdict(record("") + "\0junk"s), "bad_json");
}

}  // namespace
}  // namespace kvformat
