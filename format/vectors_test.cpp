// The C++ half of the shared vectors: every file in tests/vectors/ gets the
// verdict the index (written by the Python codec) records, every valid vector
// re-encodes byte for byte, and the name and retention tables agree.
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvtier/format/canonical_json.h"
#include "format_vectors.h"
#include "kvtier/format/header.h"
#include "kvtier/format/layout.h"
#include "kvtier/format/boundary_manifest.h"
#include "kvtier/format/namespace_record.h"
#include "kvtier/format/retention.h"

namespace kvformat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kDir = KVFORMAT_VECTORS_DIR;

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

json read_json(const fs::path& p) {
  const auto bytes = read_bytes(p);
  return json::parse(bytes.begin(), bytes.end());
}

TEST(Vectors, EveryVerdictMatchesTheIndex) {
  const json index = read_json(kDir / "index.json");
  ASSERT_GT(index["vectors"].size(), 100u);
  std::set<std::string> verdicts_seen;
  for (const auto& v : index["vectors"]) {
    const auto data = read_bytes(kDir / v["file"].get<std::string>());
    const std::string expected = v["verdict"];
    EXPECT_EQ(vector_verdict(v["kind"].get<std::string>(), data), expected)
        << v["name"] << ": " << v["note"];
    verdicts_seen.insert(expected);
  }
  // The set covers every reader verdict the format defines.
  for (Reason r : {Reason::Truncated, Reason::BadMagic, Reason::UnsupportedVersion,
                   Reason::BadHeaderLength, Reason::UnsupportedChecksumAlgorithm,
                   Reason::HeaderChecksumMismatch, Reason::ReservedNonzero, Reason::BadKeyHash,
                   Reason::FieldOutOfRange, Reason::BadSegmentTable, Reason::TrailingBytes,
                   Reason::PayloadChecksumMismatch, Reason::BadJson, Reason::BadField,
                   Reason::ManifestChecksumMismatch, Reason::ManifestInconsistent})
    EXPECT_TRUE(verdicts_seen.contains(std::string(reason_name(r)))) << reason_name(r);
}

TEST(Vectors, ValidVectorsReencodeByteForByte) {
  const json index = read_json(kDir / "index.json");
  int valid = 0;
  for (const auto& v : index["vectors"]) {
    if (!v.contains("spec")) continue;
    ++valid;
    const auto expected = read_bytes(kDir / v["file"].get<std::string>());
    auto encoded = encode_vector_spec(v["kind"].get<std::string>(), v["spec"]);
    ASSERT_TRUE(encoded) << v["name"] << ": " << encoded.error().message;
    EXPECT_EQ(*encoded, expected) << v["name"];
  }
  EXPECT_GE(valid, 8);
}

TEST(Vectors, ValidChunksParseToTheirSpec) {
  const json index = read_json(kDir / "index.json");
  for (const auto& v : index["vectors"]) {
    if (v["kind"] != "chunk" || !v.contains("spec")) continue;
    const auto data = read_bytes(kDir / v["file"].get<std::string>());
    auto h = verify_chunk(data);
    ASSERT_TRUE(h) << v["name"];
    const json& spec = v["spec"];
    EXPECT_EQ(to_hex(h->namespace_hash), spec["namespace_hash"]);
    EXPECT_EQ(h->key_hex(), spec["key_hash"]);
    EXPECT_EQ(h->group, spec["group"]);
    EXPECT_EQ(h->boundary, spec["boundary"]);
    EXPECT_EQ(h->format_version, spec["format_version"]);
    ASSERT_EQ(h->segments.size(), spec["segments"].size());
    for (std::size_t i = 0; i < h->segments.size(); ++i) {
      const auto& s = spec["segments"][i];
      EXPECT_EQ(h->segments[i].layer, s["layer"]);
      EXPECT_EQ(segment_kind_name(h->segments[i].kind), s["kind"].get<std::string>());
      EXPECT_EQ(dtype_name(h->segments[i].dtype), s["dtype"].get<std::string>());
      EXPECT_EQ(h->segments[i].shape, s["shape"].get<std::vector<std::uint64_t>>());
      EXPECT_EQ(h->segments[i].stride, s["stride"].get<std::vector<std::uint64_t>>());
      EXPECT_EQ(h->segments[i].part, s["part"].get<int>());
    }
  }
}

TEST(Vectors, ValidManifestsNameTheirFile) {
  const json index = read_json(kDir / "index.json");
  for (const auto& v : index["vectors"]) {
    if (v["kind"] != "manifest" || !v.contains("spec")) continue;
    const auto data = read_bytes(kDir / v["file"].get<std::string>());
    auto m = parse_manifest(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
    ASSERT_TRUE(m) << v["name"];
    EXPECT_EQ(m->file_name(), v["spec"]["file_name"]);
  }
}

TEST(Vectors, RecordsHashAndNameLikePython) {
  const json index = read_json(kDir / "index.json");
  int seen = 0;
  for (const auto& v : index["vectors"]) {
    if (v["kind"] != "record" || !v.contains("spec")) continue;
    ++seen;
    const json& spec = v["spec"];
    auto canonical = canonical_json(spec["fenced"]);
    ASSERT_TRUE(canonical);
    EXPECT_EQ(*canonical, spec["canonical_fenced"]) << v["name"];
    auto hash = namespace_hash(spec["fenced"]);
    ASSERT_TRUE(hash);
    EXPECT_EQ(to_hex(*hash), spec["namespace_hash"]) << v["name"];
    auto base = rank_base_name(kDefaultPrefix, spec["fenced"]["model"].get<std::string>(), *hash,
                               spec["rank"].get<std::uint32_t>());
    ASSERT_TRUE(base);
    EXPECT_EQ(*base, spec["rank_base_name"]);
    auto parsed = parse_rank_base_name(*base);
    ASSERT_TRUE(parsed);
    EXPECT_EQ(parsed->ns_short, namespace_short(*hash));
  }
  EXPECT_EQ(seen, 4);  // valid_kda, valid_escapes, valid_kda_v2, nested_64
}

// Flipped records that still parse: the hash both codecs compute (changed by
// any flip in fenced, unchanged by a flip in info).
TEST(Vectors, FlippedRecordsHashLikePython) {
  const json index = read_json(kDir / "index.json");
  int seen = 0;
  for (const auto& v : index["vectors"]) {
    if (v["kind"] != "record" || !v.contains("namespace_hash")) continue;
    ++seen;
    const auto data = read_bytes(kDir / v["file"].get<std::string>());
    auto rec = parse_namespace_record(
        std::string_view(reinterpret_cast<const char*>(data.data()), data.size()));
    ASSERT_TRUE(rec) << v["name"];
    auto hash = namespace_hash(rec->fenced);
    ASSERT_TRUE(hash);
    EXPECT_EQ(to_hex(*hash), v["namespace_hash"]) << v["name"];
  }
  EXPECT_GE(seen, 10);
}

template <class T>
json result_json(const Result<T>& r, const std::function<json(const T&)>& value) {
  if (!r) return json{{"verdict", reason_name(r.error().reason)}};
  return json{{"verdict", "ok"}, {"value", value(*r)}};
}

TEST(Vectors, NameTableMatchesPython) {
  const json names = read_json(kDir / "names.json");
  for (const auto& row : names["sanitize_model"])
    EXPECT_EQ(sanitize_model(row[0].get<std::string>()), row[1]) << row[0];
  for (const auto& row : names["chunk_rel_path"]) {
    auto rel = chunk_rel_path(row[0].get<std::string>(), row[1].get<std::uint32_t>());
    ASSERT_TRUE(rel);
    EXPECT_EQ(*rel, row[2]);
  }
  for (const auto& row : names["parse_chunk_rel_path"]) {
    auto r = parse_chunk_rel_path(row["input"].get<std::string>());
    json got = result_json<ChunkName>(r, [](const ChunkName& c) { return json{c.key, c.group}; });
    json want = row;
    want.erase("input");
    EXPECT_EQ(got, want) << row["input"];
  }
  for (const auto& row : names["parse_rank_base_name"]) {
    auto r = parse_rank_base_name(row["input"].get<std::string>());
    json got = result_json<RankBaseName>(
        r, [](const RankBaseName& n) { return json{n.prefix, n.model, n.ns_short, n.rank}; });
    json want = row;
    want.erase("input");
    EXPECT_EQ(got, want) << row["input"];
  }
  for (const auto& row : names["parse_manifest_file_name"]) {
    auto r = parse_manifest_file_name(row["input"].get<std::string>());
    json got = result_json<ManifestName>(
        r, [](const ManifestName& n) { return json{n.boundary, n.tip}; });
    json want = row;
    want.erase("input");
    EXPECT_EQ(got, want) << row["input"];
  }
  for (const auto& row : names["parse_temp_name"]) {
    auto t = parse_temp_name(row["input"].get<std::string>());
    json got = t ? json{{"verdict", "ok"}, {"value", {t->final_name, t->pid, t->tid}}}
                 : json{{"verdict", "not_temp"}};
    json want = row;
    want.erase("input");
    EXPECT_EQ(got, want) << row["input"];
  }
}

TEST(Vectors, RetentionTableMatchesPython) {
  const json table = read_json(kDir / "retention.json");
  ASSERT_GE(table["cases"].size(), 5u);
  for (const auto& c : table["cases"]) {
    const auto chains = c["chains"].get<std::map<std::string, std::vector<std::string>>>();
    auto kept = kept_manifests(chains, c["keep"].get<std::uint32_t>());
    ASSERT_TRUE(kept);
    EXPECT_EQ(*kept, c["kept"].get<std::set<std::string>>()) << c["name"];
  }
}

}  // namespace
}  // namespace kvformat
