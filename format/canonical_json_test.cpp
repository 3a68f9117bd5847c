#include "kvtier/format/canonical_json.h"

#include <gtest/gtest.h>

namespace kvformat {
namespace {

using nlohmann::json;

std::string canon(const json& v) {
  auto r = canonical_json(v);
  return r ? *r : "ERROR:" + std::string(reason_name(r.error().reason));
}

std::string strict(std::string_view text) {
  auto r = parse_strict_json(text, 1 << 20);
  return r ? canon(*r) : "ERROR:" + std::string(reason_name(r.error().reason));
}

TEST(CanonicalJson, SortedCompactAscii) {
  // Expected strings are what Python's json.dumps(sort_keys=True,
  // separators=(",", ":"), ensure_ascii=True) prints for the same values.
  EXPECT_EQ(strict(R"({ "b": [1, -2, true, null], "a": {"y": "", "x": false} })"),
            R"({"a":{"x":false,"y":""},"b":[1,-2,true,null]})");
  EXPECT_EQ(strict(R"(["\u00e9\u2603\ud83d\ude00", "\"\\/\b\f\n\r\t\u0001\u007f"])"),
            R"(["\u00e9\u2603\ud83d\ude00","\"\\/\b\f\n\r\t\u0001\u007f"])");
  EXPECT_EQ(canon(json("\xC3\xA9")), R"("\u00e9")");
  EXPECT_EQ(strict(R"({"B":1,"a":2,"\u00e9":3,"_":4})"), R"({"B":1,"_":4,"a":2,"\u00e9":3})");
  EXPECT_EQ(strict("-0"), "0");
  EXPECT_EQ(strict("[-9223372036854775808,9223372036854775807]"),
            "[-9223372036854775808,9223372036854775807]");
}

TEST(CanonicalJson, RejectsWhatPythonWouldNotRoundTrip) {
  EXPECT_EQ(strict("1.5"), "ERROR:bad_json");
  EXPECT_EQ(strict("1e3"), "ERROR:bad_json");
  EXPECT_EQ(strict("NaN"), "ERROR:bad_json");
  EXPECT_EQ(strict("9223372036854775808"), "ERROR:bad_json");
  EXPECT_EQ(strict("-9223372036854775809"), "ERROR:bad_json");
  EXPECT_EQ(strict("18446744073709551616"), "ERROR:bad_json");
  EXPECT_EQ(strict(R"({"a":1,"a":2})"), "ERROR:bad_json");
  EXPECT_EQ(strict(R"({"x":{"a":1,"a":1}})"), "ERROR:bad_json");
  EXPECT_EQ(strict(R"([{"a":1},{"a":1}])"), R"([{"a":1},{"a":1}])");  // not duplicates
  EXPECT_EQ(strict("\xEF\xBB\xBF{}"), "ERROR:bad_json");
  EXPECT_EQ(strict("\"\xFF\""), "ERROR:bad_json");
  EXPECT_EQ(strict(R"("\ud800")"), "ERROR:bad_json");
  EXPECT_EQ(strict("{} x"), "ERROR:bad_json");
  EXPECT_EQ(strict(""), "ERROR:bad_json");
  EXPECT_EQ(canon(json(1.0)), "ERROR:bad_json");
  EXPECT_EQ(canon(json(std::string("\xC3"))), "ERROR:bad_json");
  EXPECT_EQ(canon(json(std::string("\xED\xA0\x80"))), "ERROR:bad_json");  // encoded surrogate
  EXPECT_EQ(canon(json(std::string("\xC0\x80"))), "ERROR:bad_json");      // overlong
}

// FORMAT.md 4.1: a level is an array or object; the scalar inside adds none.
TEST(CanonicalJson, DepthLimit) {
  const std::string ok = std::string(64, '[') + "1" + std::string(64, ']');
  EXPECT_EQ(strict(ok), ok);
  const std::string empty_ok = std::string(63, '[') + "{}" + std::string(63, ']');
  EXPECT_EQ(strict(empty_ok), empty_ok);
  const std::string deep = std::string(65, '[') + "1" + std::string(65, ']');
  EXPECT_EQ(strict(deep), "ERROR:bad_json");
  EXPECT_EQ(strict(std::string(64, '[') + "{}" + std::string(64, ']')), "ERROR:bad_json");
  // Encoding counts alike: 64 lists encode, 65 do not.
  json v = 1;
  for (int i = 0; i < 64; ++i) v = json::array({v});
  EXPECT_EQ(canon(v), ok);
  EXPECT_EQ(canon(json::array({v})), "ERROR:bad_json");
  EXPECT_EQ(strict(std::string(100000, '[')), "ERROR:bad_json");
  // Brackets inside strings do not count.
  EXPECT_EQ(strict(R"(["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["])"),
            R"(["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["])");
}

// nlohmann's lexer reads a NUL byte as the end of input: `{}\0junk` parsed
// as `{}` while Python (and FORMAT.md 4.1) call it bad_json (issue 37).
TEST(CanonicalJson, NulByteAnywhereIsBadJson) {
  using namespace std::string_literals;
  EXPECT_EQ(strict("{}\0junk"s), "ERROR:bad_json");
  EXPECT_EQ(strict("{}\0"s), "ERROR:bad_json");
  EXPECT_EQ(strict("{\"a\":\"x\0y\"}"s), "ERROR:bad_json");
  EXPECT_EQ(strict("[1,\0 2]"s), "ERROR:bad_json");
  EXPECT_EQ(strict("{\"a\":\"x\\u0000y\"}"s), "{\"a\":\"x\\u0000y\"}");  // escaped: fine
}

TEST(CanonicalJson, SizeLimit) {
  auto r = parse_strict_json("[1,2,3]", 3);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().reason, Reason::BadJson);
}

}  // namespace
}  // namespace kvformat
