#include "kvtier/format/layout.h"

#include <gtest/gtest.h>

namespace kvformat {
namespace {

const std::string kKey = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

TEST(Layout, SanitizeModel) {
  EXPECT_EQ(sanitize_model("zai-org/GLM-5.3"), "zai-org-GLM-5.3");
  EXPECT_EQ(sanitize_model("  /x__y/ "), "x-y");
  EXPECT_EQ(sanitize_model("a/../b"), "a-..-b");
  EXPECT_EQ(sanitize_model("..."), "model");
  EXPECT_EQ(sanitize_model(""), "model");
  EXPECT_EQ(sanitize_model("a--b"), "a-b");
  EXPECT_EQ(sanitize_model(std::string(80, 'x')), std::string(64, 'x'));
  EXPECT_EQ(sanitize_model(std::string(63, 'y') + "-z"), std::string(63, 'y'));
  EXPECT_EQ(sanitize_model("M\xC3\xB6" "del"), "M-del");
}

TEST(Layout, RankBaseNameRoundTrip) {
  Sha256Digest ns{};
  ns[0] = 0xfb;
  ns[7] = 0x01;
  auto name = rank_base_name(kDefaultPrefix, "zai-org/GLM-5.3", ns, 1);
  ASSERT_TRUE(name);
  EXPECT_EQ(*name, "glm53kv_zai-org-GLM-5.3_fb00000000000001_r1");
  auto parsed = parse_rank_base_name(*name);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->prefix, "glm53kv");
  EXPECT_EQ(parsed->model, "zai-org-GLM-5.3");
  EXPECT_EQ(parsed->ns_short, "fb00000000000001");
  EXPECT_EQ(parsed->rank, 1u);
  EXPECT_EQ(namespace_record_name(*name), *name + ".json");
  EXPECT_FALSE(rank_base_name("Bad_Prefix", "m", ns, 0));
  EXPECT_FALSE(rank_base_name(kDefaultPrefix, "m", ns, 65536));
  EXPECT_FALSE(parse_rank_base_name(*name + ".json"));
  EXPECT_FALSE(parse_rank_base_name("glm53kv_m_fb00000000000001_r"));
}

TEST(Layout, ChunkPaths) {
  auto rel = chunk_rel_path(kKey, 2);
  ASSERT_TRUE(rel);
  EXPECT_EQ(*rel, "000/10_g2/" + kKey + ".bin");
  auto back = parse_chunk_rel_path(*rel);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->key, kKey);
  EXPECT_EQ(back->group, 2u);
  EXPECT_FALSE(chunk_rel_path("../../etc/passwd", 0));
  EXPECT_FALSE(chunk_rel_path(kKey, 1024));
  EXPECT_FALSE(parse_chunk_rel_path("000/11_g2/" + kKey + ".bin"));  // hh disagrees
  EXPECT_FALSE(parse_chunk_rel_path("000/10_g2/x/" + kKey + ".bin"));
  EXPECT_TRUE(is_chunk_top_dir("abc"));
  EXPECT_FALSE(is_chunk_top_dir("ABC"));
  EXPECT_FALSE(is_chunk_top_dir("manifests"));
  auto leaf = parse_chunk_leaf_dir("10_g1023");
  ASSERT_TRUE(leaf);
  EXPECT_EQ(leaf->group, 1023u);
  EXPECT_FALSE(parse_chunk_leaf_dir("10_g1024"));
  EXPECT_FALSE(parse_chunk_leaf_dir("10_g01"));
  EXPECT_TRUE(parse_chunk_file_name(kKey + ".bin", "000", "10"));
  EXPECT_FALSE(parse_chunk_file_name(kKey + ".bin", "001", "10"));
  EXPECT_FALSE(parse_chunk_file_name(kKey + ".bin.tmp.1.2", "000", "10"));
}

TEST(Layout, ManifestAndTempNames) {
  auto name = manifest_file_name(3584, kKey);
  ASSERT_TRUE(name);
  EXPECT_EQ(*name, "b3584_" + kKey + ".json");
  auto parsed = parse_manifest_file_name(*name);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->boundary, 3584u);
  EXPECT_EQ(parsed->tip, kKey);
  EXPECT_FALSE(parse_manifest_file_name("b0_" + kKey + ".json"));
  EXPECT_FALSE(parse_manifest_file_name("b01_" + kKey + ".json"));

  const std::string tmp = temp_name(*name, 4242, 4243);
  EXPECT_EQ(tmp, *name + ".tmp.4242.4243");
  auto t = parse_temp_name(tmp);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->final_name, *name);
  EXPECT_EQ(t->pid, 4242u);
  EXPECT_EQ(t->tid, 4243u);
  EXPECT_FALSE(parse_temp_name(*name));
  EXPECT_FALSE(parse_temp_name(".tmp.1.2"));
  EXPECT_FALSE(parse_temp_name("x.tmp.0.2"));
  EXPECT_FALSE(parse_temp_name("x.tmp.1."));
}

TEST(Layout, PendingNames) {
  auto name = pending_file_name(12, 34);
  ASSERT_TRUE(name);
  EXPECT_EQ(*name, "12.34.json");
  auto parsed = parse_pending_file_name(*name);
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->pid, 12u);
  EXPECT_EQ(parsed->tid, 34u);
  EXPECT_TRUE(pending_file_name(9'999'999'999'999'999'999ULL, 1));
  for (auto [pid, tid] : {std::pair<std::uint64_t, std::uint64_t>{0, 1}, {1, 0},
                          {10'000'000'000'000'000'000ULL, 1}, {1, ~0ULL}}) {
    auto bad = pending_file_name(pid, tid);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().reason, Reason::BadName);
  }
}

TEST(Layout, Hex) {
  const std::vector<std::uint8_t> bytes = {0x00, 0xab, 0xff};
  EXPECT_EQ(to_hex(bytes), "00abff");
  EXPECT_EQ(*from_hex("00abff"), bytes);
  EXPECT_FALSE(from_hex("00ABFF"));
  EXPECT_FALSE(from_hex("abc"));
  EXPECT_TRUE(is_key_hex(std::string(16, 'a')));
  EXPECT_FALSE(is_key_hex(std::string(14, 'a')));
  EXPECT_FALSE(is_key_hex(std::string(130, 'a')));
  EXPECT_FALSE(is_key_hex(std::string(17, 'a')));
}

}  // namespace
}  // namespace kvformat
