// The record calls of the C ABI (store_abi.h, ABI 5) against format/ itself:
// the same bytes as the codec's own encoders, the codec's verdicts for bad,
// truncated and oversize input, bad_argument for what a call does not take,
// and (with OpenSSL) the MAC: a wrong key, a missing or malformed mac.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvtier/format/boundary_manifest.h"
#include "kvtier/format/namespace_record.h"
#include "kvtier/format/pending_record.h"
#include "kvtier/store_abi.h"
#include "test_manifest_sample.h"

namespace {

using nlohmann::json;

// One call's outcome, its data copied out and freed.
struct Out {
  std::int32_t status = -1;
  std::string reason;
  std::string message;
  std::string data;
  bool ok() const { return status == KVTIER_OK; }
};

template <class Call>
Out call(Call&& fn) {
  kvtier_result r{};
  r.status = 99;
  const std::int32_t status = fn(&r);
  Out out{r.status, r.reason, r.message,
          r.data ? std::string(reinterpret_cast<const char*>(r.data), r.length) : std::string()};
  EXPECT_EQ(status, r.status);
  if (r.data) {
    EXPECT_EQ(r.data[r.length], 0);  // a NUL after the output
  }
  if (!out.ok()) {
    EXPECT_EQ(r.data, nullptr);
  }
  kvtier_free(r.data);
  return out;
}

const auto u8 = [](const std::string& s) { return reinterpret_cast<const std::uint8_t*>(s.data()); };

std::string encode(const std::string& fields, const std::vector<std::uint8_t>* key = nullptr) {
  return call([&](kvtier_result* r) {
           return kvtier_manifest_encode(fields.data(), fields.size(), key ? key->data() : nullptr,
                                         key ? static_cast<std::uint32_t>(key->size()) : 0, r);
         })
      .data;
}

Out decode(const std::string& bytes, const std::vector<std::uint8_t>* key = nullptr) {
  return call([&](kvtier_result* r) {
    return kvtier_manifest_decode(u8(bytes), bytes.size(), key ? key->data() : nullptr,
                                  key ? static_cast<std::uint32_t>(key->size()) : 0, r);
  });
}

// The sample manifest's fields: its canonical file less the checksum.
json sample_fields() {
  auto j = json::parse(*kvformat::encode_manifest(kvformat::testing::sample_manifest()));
  j.erase("checksum");
  return j;
}

TEST(Records, ManifestEncodeIsTheCodecsBytesAndDecodeRoundTrips) {
  const std::string want = *kvformat::encode_manifest(kvformat::testing::sample_manifest());
  EXPECT_EQ(encode(sample_fields().dump(2)), want);
  const Out back = decode(want);
  ASSERT_TRUE(back.ok()) << back.message;
  EXPECT_EQ(back.data, want);
  // A file in another layout whose checksum holds comes back canonical.
  EXPECT_EQ(decode(json::parse(want).dump(1)).data, want);
  // v1 stays v1.
  auto v1 = kvformat::testing::sample_manifest();
  v1.format = 1;
  const std::string old = *kvformat::encode_manifest(v1);
  EXPECT_EQ(decode(old).data, old);
}

TEST(Records, ManifestVerdicts) {
  const std::string good = *kvformat::encode_manifest(kvformat::testing::sample_manifest());
  EXPECT_EQ(decode(good.substr(0, good.size() - 1)).reason, "bad_json");  // truncated
  EXPECT_EQ(decode("").reason, "bad_json");
  EXPECT_EQ(decode(std::string(kvformat::kMaxManifestBytes + 1, ' ')).reason, "bad_json");
  auto changed = good;
  changed.replace(changed.find("\"rank\":1"), 8, "\"rank\":2");
  EXPECT_EQ(decode(changed).reason, "manifest_checksum_mismatch");
  EXPECT_EQ(decode(changed).status, KVTIER_E_FORMAT);
  auto fields = sample_fields();
  fields["boundary"] = 47;
  const Out bad = call([&](kvtier_result* r) {
    const std::string text = fields.dump();
    return kvtier_manifest_encode(text.data(), text.size(), nullptr, 0, r);
  });
  EXPECT_EQ(bad.reason, "manifest_inconsistent");
  fields = sample_fields();
  fields["format"] = 3;
  EXPECT_EQ(call([&](kvtier_result* r) {
              const std::string text = fields.dump();
              return kvtier_manifest_encode(text.data(), text.size(), nullptr, 0, r);
            }).reason,
            "unsupported_version");
}

TEST(Records, BadArgumentsAreRefused) {
  EXPECT_EQ(kvtier_manifest_encode("{}", 2, nullptr, 0, nullptr), KVTIER_E_ARGUMENT);
  const Out null_input = call([](kvtier_result* r) { return kvtier_manifest_decode(nullptr, 5, nullptr, 0, r); });
  EXPECT_EQ(null_input.status, KVTIER_E_ARGUMENT);
  EXPECT_EQ(null_input.reason, "bad_argument");
  static const std::uint8_t some_key[1] = {1};
  const Out empty = call([&](kvtier_result* r) {
    return kvtier_manifest_decode(u8("{}"), 2, some_key, 0, r);  // a key of no bytes
  });
  EXPECT_EQ(empty.reason, "bad_argument");
}

#if KVTIER_STORE_HAVE_MAC
TEST(Records, KeyedManifests) {
  const std::vector<std::uint8_t> key(32, 7), other(32, 8);
  const std::string sealed = encode(sample_fields().dump(), &key);
  ASSERT_NE(sealed.find("\"mac\":\""), std::string::npos);
  const std::string plain = *kvformat::encode_manifest(kvformat::testing::sample_manifest());
  const Out opened = decode(sealed, &key);
  ASSERT_TRUE(opened.ok()) << opened.message;
  EXPECT_EQ(opened.data, plain);  // without its mac
  EXPECT_EQ(decode(sealed, &other).reason, "mac_mismatch");
  EXPECT_EQ(decode(plain, &key).reason, "mac_missing");
  EXPECT_EQ(decode(sealed).reason, "manifest_checksum_mismatch");  // the CRC takes "mac" in
  EXPECT_EQ(decode(sealed.substr(0, sealed.size() / 2), &key).reason, "bad_json");
  auto malformed = sealed;
  malformed.replace(malformed.find("\"mac\":\"") + 7, 2, "ZZ");
  EXPECT_EQ(decode(malformed, &key).reason, "mac_mismatch");
  EXPECT_EQ(decode(std::string(kvformat::kMaxManifestBytes + 1, ' '), &key).reason, "bad_json");
}

TEST(Records, KeyIdIsTheCodecsVector) {
  std::vector<std::uint8_t> key(32);
  for (std::size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(call([&](kvtier_result* r) { return kvtier_mac_key_id(key.data(), 32, r); }).data,
            "3f03aa1bf45caef5");
  EXPECT_EQ(call([&](kvtier_result* r) { return kvtier_mac_key_id(nullptr, 0, r); }).reason,
            "bad_argument");
}
#endif

const char kRecord[] =
    R"({"info": {"rank": 0}, "fenced": {"format_version": 2, "model": "m", "vllm_version": "v",
        "build_id": "", "tp_size": 1, "kv_dtype": "bfloat16", "hash_algorithm": "sha256",
        "num_speculative_tokens": 0, "page_sizes": [[0, 4096]], "state_abi": {}}})";

Out record_encode(const std::string& text) {
  return call([&](kvtier_result* r) { return kvtier_namespace_record_encode(text.data(), text.size(), r); });
}
Out record_decode(const std::string& bytes) {
  return call([&](kvtier_result* r) { return kvtier_namespace_record_decode(u8(bytes), bytes.size(), r); });
}

TEST(Records, NamespaceRecords) {
  const Out encoded = record_encode(kRecord);
  ASSERT_TRUE(encoded.ok()) << encoded.message;
  const auto parsed = json::parse(kRecord);
  EXPECT_EQ(encoded.data, *kvformat::encode_namespace_record({parsed["fenced"], parsed["info"]}));
  EXPECT_EQ(record_decode(encoded.data).data, encoded.data);
  EXPECT_EQ(record_decode(kRecord).data, encoded.data);  // any layout reads, canonical back
  EXPECT_EQ(record_decode(encoded.data.substr(0, 20)).reason, "bad_json");
  EXPECT_EQ(record_decode(std::string(kvformat::kMaxRecordBytes + 1, ' ')).reason, "bad_json");
  auto later = parsed;
  later["fenced"]["format_version"] = 3;
  EXPECT_EQ(record_encode(later.dump()).reason, "unsupported_version");
  EXPECT_EQ(record_decode(later.dump()).reason, "unsupported_version");
  auto no_info = parsed;
  no_info["info"] = 1;
  EXPECT_EQ(record_encode(no_info.dump()).reason, "bad_field");
  EXPECT_EQ(record_decode(no_info.dump()).reason, "bad_field");
  EXPECT_EQ(record_encode(parsed["fenced"].dump()).reason, "bad_argument");  // not a record
}

Out hash(const std::string& fenced, std::uint32_t flags) {
  return call([&](kvtier_result* r) { return kvtier_namespace_hash(fenced.data(), fenced.size(), flags, r); });
}

TEST(Records, NamespaceHash) {
  const auto fenced = json::parse(kRecord)["fenced"];
  const Out got = hash(fenced.dump(), KVTIER_FENCED_CHECK);
  ASSERT_TRUE(got.ok()) << got.message;
  const auto want = *kvformat::namespace_hash(fenced);
  EXPECT_EQ(got.data, std::string(want.begin(), want.end()));
  const std::string loose = R"({"format_version": 9})";
  EXPECT_TRUE(hash(loose, 0).ok());  // unchecked: any object hashes
  EXPECT_EQ(hash(loose, KVTIER_FENCED_CHECK).reason, "unsupported_version");
  EXPECT_EQ(hash(R"({"x": 1.5})", 0).reason, "bad_json");
  EXPECT_EQ(hash("{}", 2).reason, "bad_argument");
}

Out canonical(const std::string& text) {
  return call([&](kvtier_result* r) { return kvtier_canonical_json(text.data(), text.size(), r); });
}

TEST(Records, CanonicalJson) {
  // tests/python: the same value, the same bytes.
  EXPECT_EQ(canonical("{\"format_version\": 1, \"b\": [1, 2], \"a\": {\"y\": 1, \"x\": \"\xc3\xa9\"}}").data,
            R"({"a":{"x":"\u00e9","y":1},"b":[1,2],"format_version":1})");
  EXPECT_EQ(canonical(R"({"x": 1.5})").reason, "bad_json");
  EXPECT_EQ(canonical(R"({"a": 1, "a": 2})").reason, "bad_json");
  EXPECT_EQ(canonical(std::string(65, '[') + std::string(65, ']')).reason, "bad_json");
  EXPECT_EQ(canonical("[1").reason, "bad_json");
}

Out pending_encode(const std::string& chunks) {
  return call([&](kvtier_result* r) { return kvtier_pending_record_encode(chunks.data(), chunks.size(), r); });
}
Out pending_decode(const std::string& bytes) {
  return call([&](kvtier_result* r) { return kvtier_pending_record_decode(u8(bytes), bytes.size(), r); });
}

TEST(Records, PendingRecords) {
  const std::string a(32, 'a'), b(32, 'b');
  const Out got = pending_encode("[[2, \"" + a + "\"], [0, \"" + b + "\"], [2, \"" + a + "\"]]");
  ASSERT_TRUE(got.ok()) << got.message;
  const std::string want =
      R"({"chunks":[[0,")" + b + R"("],[2,")" + a + R"("]],"format":1,"kind":"pending_chunks"})";
  EXPECT_EQ(got.data, want);
  EXPECT_EQ(pending_decode(want).data, want);
  EXPECT_EQ(pending_encode("[]").data, R"({"chunks":[],"format":1,"kind":"pending_chunks"})");
  EXPECT_EQ(pending_encode("[[1024, \"" + a + "\"]]").reason, "bad_field");
  EXPECT_EQ(pending_encode("[[-1, \"" + a + "\"]]").reason, "bad_field");
  EXPECT_EQ(pending_encode("[[true, \"" + a + "\"]]").reason, "bad_field");
  EXPECT_EQ(pending_encode(R"([[0, "xyz"]])").reason, "bad_field");
  EXPECT_EQ(pending_encode(R"({"chunks": []})").reason, "bad_argument");
  const std::string unsorted =
      R"({"chunks":[[2,")" + a + R"("],[0,")" + b + R"("]],"format":1,"kind":"pending_chunks"})";
  EXPECT_EQ(pending_decode(unsorted).reason, "bad_field");
  EXPECT_EQ(pending_decode(want.substr(0, want.size() - 2)).reason, "bad_json");
  EXPECT_EQ(pending_decode(R"({"chunks":[],"format":2,"kind":"pending_chunks"})").reason,
            "unsupported_version");
  EXPECT_EQ(pending_decode(std::string(kvformat::kMaxPendingBytes + 1, ' ')).reason, "bad_json");
}

Out kept(const std::string& chains, std::uint32_t keep) {
  return call([&](kvtier_result* r) { return kvtier_kept_manifests(chains.data(), chains.size(), keep, r); });
}

TEST(Records, KeptManifestsIsTheWorkedExample) {
  const std::string chains =
      "M1\ta\nM2\ta\tb\nM3\ta\tb\tc\nM4\ta\tb\tc\td\n"
      "M3x\ta\tb\tx\nM4x\ta\tb\tx\ty\nM5x\ta\tb\tx\ty\tz\n";
  EXPECT_EQ(kept(chains, 1).data, "M4\nM5x\n");
  EXPECT_EQ(kept(chains, 2).data, "M3\nM4\nM4x\nM5x\n");
  EXPECT_EQ(kept(chains, 3).data, "M2\nM3\nM3x\nM4\nM4x\nM5x\n");
  EXPECT_EQ(kept(chains, 0).data, "M1\nM2\nM3\nM3x\nM4\nM4x\nM5x\n");
  EXPECT_EQ(kept("", 2).data, "");
  EXPECT_EQ(kept("lonely\n", 2).data, "lonely\n");  // an empty chain is its own leaf
  EXPECT_EQ(kept(chains, 1025).reason, "field_out_of_range");
  EXPECT_EQ(kept("M1\ta", 2).reason, "bad_argument");  // truncated: no last newline
  EXPECT_EQ(kept("M1\ta\nM1\tb\n", 2).reason, "bad_argument");  // a name twice
  EXPECT_EQ(call([](kvtier_result* r) { return kvtier_kept_manifests(nullptr, 3, 2, r); }).reason,
            "bad_argument");
}

}  // namespace
