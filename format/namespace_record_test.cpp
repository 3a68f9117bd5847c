#include "kvtier/format/namespace_record.h"

#include <gtest/gtest.h>

#include "kvtier/format/layout.h"

namespace kvformat {
namespace {

using nlohmann::json;

json fenced() {
  return json{{"format_version", 1},
              {"model", "zai-org/GLM-5.3"},
              {"vllm_version", "0.33.0"},
              {"build_id", ""},
              {"tp_size", 2},
              {"kv_dtype", "auto"},
              {"hash_algorithm", "sha256_cbor"},
              {"num_speculative_tokens", 0},
              {"page_sizes", {{0, 27163136}, {2, 21086208}}},
              {"state_abi", {{"kind", "kda"}}}};
}

std::string reason_of(const json& f) {
  auto r = check_fenced(f);
  return r ? "ok" : std::string(reason_name(r.error().reason));
}

TEST(NamespaceRecord, RoundTrip) {
  NamespaceRecord rec{fenced(), json{{"keep_boundaries", 2}, {"rank", 1}}};
  auto text = encode_namespace_record(rec);
  ASSERT_TRUE(text) << text.error().message;
  EXPECT_TRUE(text->starts_with(R"({"fenced":{"build_id":"","format_version":1,)"));
  auto back = parse_namespace_record(*text);
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->fenced, rec.fenced);
  EXPECT_EQ(back->info, rec.info);
}

TEST(NamespaceRecord, HashCoversFencedOnly) {
  const auto base = *namespace_hash(fenced());
  // Same value built in another key order: same canonical form, same hash.
  json reordered = json::object();
  for (const char* k : {"state_abi", "tp_size", "page_sizes", "num_speculative_tokens", "model",
                        "kv_dtype", "hash_algorithm", "format_version", "build_id", "vllm_version"})
    reordered[k] = fenced()[k];
  EXPECT_EQ(*namespace_hash(reordered), base);
  for (const auto& [k, v] : {std::pair<const char*, json>{"build_id", "x"},
                            {"tp_size", 1},
                            {"num_speculative_tokens", 1},
                            {"page_sizes", json{{0, 27163137}, {2, 21086208}}},
                            {"state_abi", json::object()}}) {
    auto changed = fenced();
    changed[k] = v;
    EXPECT_NE(*namespace_hash(changed), base) << k;
  }
  EXPECT_EQ(namespace_short(base).size(), 16u);
  EXPECT_EQ(namespace_short(base), to_hex(base).substr(0, 16));
}

TEST(NamespaceRecord, FencedChecks) {
  EXPECT_EQ(reason_of(fenced()), "ok");
  auto f = fenced();
  f["format_version"] = 3;
  EXPECT_EQ(reason_of(f), "unsupported_version");
  f["format_version"] = 2;
  EXPECT_EQ(reason_of(f), "ok");
  f = fenced();
  f.erase("model");
  EXPECT_EQ(reason_of(f), "bad_field");
  f = fenced();
  f["model"] = "";
  EXPECT_EQ(reason_of(f), "bad_field");
  f = fenced();
  f["tp_size"] = 0;
  EXPECT_EQ(reason_of(f), "bad_field");
  f = fenced();
  f["page_sizes"] = json{{2, 1}, {0, 1}};
  EXPECT_EQ(reason_of(f), "bad_field");
  f = fenced();
  f["page_sizes"] = json{{0, 1, 2}};
  EXPECT_EQ(reason_of(f), "bad_field");
  f = fenced();
  f["state_abi"] = json::array();
  EXPECT_EQ(reason_of(f), "bad_field");
  f = fenced();
  f["future_field"] = "ok";  // extra fenced keys are allowed and hashed
  EXPECT_EQ(reason_of(f), "ok");
  EXPECT_EQ(reason_of(json::array()), "bad_field");
}

TEST(NamespaceRecord, RecordShape) {
  auto reason = [](std::string_view text) {
    auto r = parse_namespace_record(text);
    return r ? "ok" : std::string(reason_name(r.error().reason));
  };
  const std::string f = fenced().dump();
  EXPECT_EQ(reason(R"({"fenced":)" + f + R"(,"info":{}})"), "ok");
  EXPECT_EQ(reason(R"({"fenced":)" + f + "}"), "bad_field");
  EXPECT_EQ(reason(R"({"fenced":)" + f + R"(,"info":[]})"), "bad_field");
  EXPECT_EQ(reason(R"({"fenced":)" + f + R"(,"info":{},"x":1})"), "bad_field");
  EXPECT_EQ(reason(R"({"fenced":)" + f + R"(,"info":{"t":1.5}})"), "bad_json");
}

}  // namespace
}  // namespace kvformat
