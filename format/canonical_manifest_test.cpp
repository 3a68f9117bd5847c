// parse_manifest's canonical-layout scanner against the general JSON path:
// whatever the bytes, both must give the same verdict and the same manifest.
#include "canonical_manifest.h"

#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvtier/format/canonical_json.h"
#include "kvtier/format/crc32.h"
#include "test_manifest_sample.h"

namespace kvformat {
namespace {

using nlohmann::json;

using testing::key;

// The shared sample plus a third group whose last entry is 2^34 bytes long.
BoundaryManifest sample() {
  BoundaryManifest m = testing::sample_manifest();
  m.rank = 3;
  m.groups.push_back({7, GroupKind::Full, {{key('a'), 1, 0}, {key('b'), 1, 0}, {key('c'), 17179869184, 9}}});
  return m;
}

// The verdict of a parse: "ok" plus the manifest's encoding, or the reason.
std::string verdict(const Result<BoundaryManifest>& r) {
  if (!r) return std::string(reason_name(r.error().reason));
  return "ok " + *encode_manifest(*r);
}

void expect_same_verdict(std::string_view bytes, const std::string& what) {
  EXPECT_EQ(verdict(parse_manifest(bytes)), verdict(parse_manifest_json(bytes))) << what;
}

// The body re-sealed: checksum recomputed, written canonically.
std::string sealed(json body) {
  body.erase("checksum");
  auto text = canonical_json(body);
  if (!text) return body.dump();
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x",
                crc32({reinterpret_cast<const std::uint8_t*>(text->data()), text->size()}));
  body["checksum"] = hex;
  return *canonical_json(body);
}

TEST(CanonicalManifest, TakesWhatWritersWrite) {
  const std::string text = *encode_manifest(sample());
  auto fast = parse_canonical_manifest(text);
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(*fast, sample());
  EXPECT_EQ(*fast, *parse_manifest_json(text));
}

TEST(CanonicalManifest, LeavesOtherLayoutsToTheJsonPath) {
  const std::string text = *encode_manifest(sample());
  // Valid but not canonical: a space after the first colon.
  std::string spaced = text;
  spaced.insert(spaced.find(':') + 1, " ");
  EXPECT_FALSE(parse_canonical_manifest(spaced).has_value());
  auto m = parse_manifest(spaced);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(*m, sample());
}

TEST(CanonicalManifest, EveryVectorGetsTheSameVerdict) {
  namespace fs = std::filesystem;
  const fs::path dir = KVFORMAT_VECTORS_DIR;
  std::ifstream in(dir / "index.json");
  const json index = json::parse(in);
  int manifests = 0;
  for (const auto& v : index["vectors"]) {
    if (v["kind"] != "manifest") continue;
    std::ifstream f(dir / v["file"].get<std::string>(), std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(f), {}};
    expect_same_verdict(bytes, v["name"].get<std::string>());
    ++manifests;
  }
  EXPECT_GT(manifests, 30);
}

// Every one-byte change of a valid manifest: replaced, deleted, or a byte
// inserted before it. Most break the checksum; all must agree.
TEST(CanonicalManifest, EveryOneByteChangeGetsTheSameVerdict) {
  const std::string text = *encode_manifest(sample());
  const std::string alphabet = " 0129afgA\",:[]{}-.e";
  for (std::size_t i = 0; i < text.size(); ++i) {
    for (char c : alphabet) {
      std::string changed = text;
      changed[i] = c;
      expect_same_verdict(changed, "byte " + std::to_string(i) + " := " + c);
      std::string inserted = text;
      inserted.insert(i, 1, c);
      expect_same_verdict(inserted, "insert at " + std::to_string(i));
    }
    std::string deleted = text;
    deleted.erase(i, 1);
    expect_same_verdict(deleted, "delete " + std::to_string(i));
  }
}

// Changes whose checksum is made to hold, so every field and structure rule
// is reached on both paths.
TEST(CanonicalManifest, SealedChangesGetTheSameVerdict) {
  const json good = json::parse(*encode_manifest(sample()));
  std::vector<std::pair<std::string, std::function<void(json&)>>> changes = {
      {"boundary off by one", [](json& j) { j["boundary"] = 47; }},
      {"boundary zero", [](json& j) { j["boundary"] = 0; }},
      {"boundary huge", [](json& j) { j["boundary"] = 1ull << 41; }},
      {"chain empty", [](json& j) { j["chain"] = json::array(); }},
      {"chain repeats", [](json& j) { j["chain"][1] = key('a'); }},
      {"chain key upper", [](json& j) { j["chain"][0] = std::string(32, 'A'); }},
      {"chain key short", [](json& j) { j["chain"][0] = std::string(14, 'a'); }},
      {"chain key odd", [](json& j) { j["chain"][0] = std::string(33, 'a'); }},
      {"chain key number", [](json& j) { j["chain"][0] = 5; }},
      {"format 3", [](json& j) { j["format"] = 3; }},
      {"format 1", [](json& j) { j["format"] = 1; }},
      {"algorithm 2", [](json& j) { j["checksum_algorithm"] = 2; }},
      {"chunk_tokens 0", [](json& j) { j["chunk_tokens"] = 0; }},
      {"rank too big", [](json& j) { j["rank"] = 70000; }},
      {"rank negative", [](json& j) { j["rank"] = -1; }},
      {"kind other", [](json& j) { j["kind"] = "manifest"; }},
      {"namespace short", [](json& j) { j["namespace"] = std::string(62, 'e'); }},
      {"namespace upper", [](json& j) { j["namespace"] = std::string(64, 'E'); }},
      {"extra member", [](json& j) { j["extra"] = 1; }},
      {"member missing", [](json& j) { j.erase("rank"); }},
      {"groups empty", [](json& j) { j["groups"] = json::array(); }},
      {"groups unsorted", [](json& j) { std::swap(j["groups"][0], j["groups"][2]); }},
      {"groups repeat", [](json& j) { j["groups"][2]["group"] = 2; }},
      {"group too big", [](json& j) { j["groups"][2]["group"] = 1024; }},
      {"group kind other", [](json& j) { j["groups"][0]["kind"] = "mamba"; }},
      {"group extra member", [](json& j) { j["groups"][0]["x"] = 1; }},
      {"full entries short", [](json& j) { j["groups"][0]["entries"].erase(2); }},
      {"full entries reordered", [](json& j) { std::swap(j["groups"][0]["entries"][0], j["groups"][0]["entries"][1]); }},
      {"state entry not tip", [](json& j) { j["groups"][1]["entries"][0][0] = key('b'); }},
      {"state two entries", [](json& j) { j["groups"][1]["entries"].push_back(j["groups"][1]["entries"][0]); }},
      {"entry length 0", [](json& j) { j["groups"][0]["entries"][0][1] = 0; }},
      {"entry length huge", [](json& j) { j["groups"][0]["entries"][0][1] = (1ull << 34) + 1; }},
      {"entry checksum 2^32", [](json& j) { j["groups"][0]["entries"][0][2] = 1ull << 32; }},
      {"entry checksum negative", [](json& j) { j["groups"][0]["entries"][0][2] = -1; }},
      {"entry four items", [](json& j) { j["groups"][0]["entries"][0].push_back(1); }},
      {"entry length bool", [](json& j) { j["groups"][0]["entries"][0][1] = true; }},
      {"entry length float", [](json& j) { j["groups"][0]["entries"][0][1] = 1.5; }},
      {"entry length string", [](json& j) { j["groups"][0]["entries"][0][1] = "100"; }},
  };
  for (auto& [name, change] : changes) {
    json j = good;
    change(j);
    expect_same_verdict(sealed(j), name);
  }
  // Integers the scanner declines (19 digits; a leading zero) but JSON may hold.
  std::string text = *encode_manifest(sample());
  std::string big = text;
  big.replace(big.find("\"rank\":3"), 8, "\"rank\":1000000000000000000");
  expect_same_verdict(big, "19-digit rank");
  std::string zero = text;
  zero.replace(zero.find("\"rank\":3"), 8, "\"rank\":03");
  expect_same_verdict(zero, "leading zero");
  EXPECT_FALSE(parse_canonical_manifest(zero).has_value());
}

}  // namespace
}  // namespace kvformat
