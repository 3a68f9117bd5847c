#include "kvtier/format/boundary_manifest.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kvtier/format/canonical_json.h"
#include "kvtier/format/crc32.h"
#include "test_manifest_sample.h"

namespace kvformat {
namespace {

using testing::key;

BoundaryManifest sample() { return testing::sample_manifest(); }

std::string reason_of(std::string_view text) {
  auto r = parse_manifest(text);
  return r ? "ok" : std::string(reason_name(r.error().reason));
}

// Re-seals a JSON body with a matching checksum so the later checks are reached.
std::string sealed(nlohmann::json body) {
  body.erase("checksum");
  const std::string text = body.dump();  // nlohmann sorts keys; compact
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x",
                crc32({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}));
  body["checksum"] = hex;
  return body.dump();
}

TEST(Manifest, RoundTripAndName) {
  auto text = encode_manifest(sample());
  ASSERT_TRUE(text) << text.error().message;
  auto m = parse_manifest(*text);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(*m, sample());
  EXPECT_EQ(m->file_name(), "b48_" + key('c') + ".json");
  EXPECT_EQ(m->tip(), key('c'));
  EXPECT_EQ(text->find(' '), std::string::npos);
  EXPECT_EQ(text->find("\"checksum\":\""), text->find("\"checksum\""));
}

TEST(Manifest, ChecksumCoversEveryField) {
  const std::string text = *encode_manifest(sample());
  auto j = nlohmann::json::parse(text);
  j["groups"][1]["entries"][0][1] = 45;  // entry length changed, checksum kept
  EXPECT_EQ(reason_of(j.dump()), "manifest_checksum_mismatch");
  j = nlohmann::json::parse(text);
  j["rank"] = 0;
  EXPECT_EQ(reason_of(j.dump()), "manifest_checksum_mismatch");
}

TEST(Manifest, ReaderOrder) {
  const auto j = nlohmann::json::parse(*encode_manifest(sample()));
  auto with = [&](const char* k, nlohmann::json v) {
    auto c = j;
    c[k] = v;
    return sealed(c);
  };
  EXPECT_EQ(reason_of(with("format", 3)), "unsupported_version");
  EXPECT_EQ(reason_of(with("format", 0)), "unsupported_version");
  EXPECT_EQ(reason_of(with("format", 1)), "ok");  // v1 and v2 share the structure
  EXPECT_EQ(reason_of(with("format", 2)), "ok");
  EXPECT_EQ(reason_of(with("checksum_algorithm", 2)), "unsupported_checksum_algorithm");
  EXPECT_EQ(reason_of(with("format", "1")), "bad_field");
  EXPECT_EQ(reason_of(with("rank", true)), "bad_field");
  EXPECT_EQ(reason_of(with("extra", 1)), "bad_field");
  EXPECT_EQ(reason_of(with("boundary", 47)), "manifest_inconsistent");
  EXPECT_EQ(reason_of(with("chain", {"../../../etc/passwd0000", key('b'), key('c')})),
            "bad_field");
  EXPECT_EQ(reason_of("{"), "bad_json");
  EXPECT_EQ(reason_of("[]"), "bad_field");
  auto unsealed = j;
  unsealed["checksum"] = "ABCDEF01";
  EXPECT_EQ(reason_of(unsealed.dump()), "bad_field");
}

TEST(Manifest, EncodeRefusesInconsistentManifests) {
  auto m = sample();
  m.groups[0].entries.pop_back();
  EXPECT_EQ(encode_manifest(m).error().reason, Reason::ManifestInconsistent);
  m = sample();
  m.groups[1].entries[0].key = key('a');
  EXPECT_EQ(encode_manifest(m).error().reason, Reason::ManifestInconsistent);
  m = sample();
  std::swap(m.groups[0], m.groups[1]);
  EXPECT_EQ(encode_manifest(m).error().reason, Reason::ManifestInconsistent);
  m = sample();
  m.chain[0] = "not-hex";
  EXPECT_EQ(encode_manifest(m).error().reason, Reason::BadField);
  m = sample();
  m.groups[0].entries[0].length = 0;
  EXPECT_EQ(encode_manifest(m).error().reason, Reason::BadField);
}

// A keyed store's manifest (FORMAT.md 3.6): "mac" split off, the rest the
// canonical JSON the MAC covers and parse_manifest reads.
TEST(BoundaryManifest, SealedManifestSplitsItsMac) {
  const auto plain = encode_manifest(sample()).value();
  auto none = split_manifest_mac(plain);
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none) << "a plain manifest has no mac";
  auto value = nlohmann::json::parse(plain);
  value["mac"] = std::string(64, 'a');
  const auto with_mac = canonical_json(value).value();
  auto split = split_manifest_mac(with_mac);
  ASSERT_TRUE(split);
  ASSERT_TRUE(*split);
  EXPECT_EQ((*split)->mac, std::string(64, 'a'));
  EXPECT_EQ((*split)->body, plain);
  EXPECT_EQ(parse_manifest((*split)->body).value(), sample());
  EXPECT_FALSE(parse_manifest(with_mac)) << "read whole, the mac breaks its checksum";
  value["mac"] = "AA";
  auto bad = split_manifest_mac(canonical_json(value).value());
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().reason, Reason::BadField);
}

TEST(Manifest, FieldsAreJudgedAsAReaderJudgesAFile) {
  auto fields = nlohmann::json::parse(*encode_manifest(sample()));
  fields.erase("checksum");
  auto m = parse_manifest_fields(fields.dump(2));  // any layout
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(*m, sample());
  const auto reason = [&](const char* k, nlohmann::json v) {
    auto c = fields;
    if (v.is_discarded())
      c.erase(k);
    else
      c[k] = v;
    auto r = parse_manifest_fields(c.dump());
    return r ? std::string("ok") : std::string(reason_name(r.error().reason));
  };
  const auto gone = nlohmann::json(nlohmann::json::value_t::discarded);
  EXPECT_EQ(reason("format", 3), "unsupported_version");
  EXPECT_EQ(reason("format", "2"), "bad_field");
  EXPECT_EQ(reason("format", gone), "bad_field");
  EXPECT_EQ(reason("checksum_algorithm", 2), "unsupported_checksum_algorithm");
  EXPECT_EQ(reason("rank", -1), "bad_field");
  EXPECT_EQ(reason("chain", nlohmann::json::array()), "bad_field");
  EXPECT_EQ(reason("boundary", 47), "manifest_inconsistent");
  EXPECT_EQ(reason("checksum", "00000000"), "bad_field");  // the encoder adds it
  EXPECT_EQ(reason("mac", std::string(64, '0')), "bad_field");
  EXPECT_EQ(reason("kind", "pending_chunks"), "bad_field");
  for (const char* text : {"[]", "{", "{\"format\":2.5}"}) {
    auto r = parse_manifest_fields(text);
    ASSERT_FALSE(r) << text;
  }
  EXPECT_EQ(reason_name(parse_manifest_fields("[]").error().reason), "bad_field");
  EXPECT_EQ(reason_name(parse_manifest_fields(std::string(kMaxManifestBytes + 1, ' ')).error().reason),
            "bad_json");
}

}  // namespace
}  // namespace kvformat
