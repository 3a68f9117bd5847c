#include "report.h"

#include <gtest/gtest.h>

namespace cxxscope {
namespace {

TEST(CxxReport, ParsesTheToolsAnswer) {
  auto r = parse_reports(R"([{"file": "a.cpp", "ok": true, "definitions": [
      {"kind": "function", "name": "f", "qualified": "n::f", "begin": 2, "end": 5, "name_line": 2, "valid": true}],
      "inactive": [[7, 9]], "macros": [], "diagnostics": [{"severity": "error", "file": "/a.cpp", "line": 3,
      "message": "m"}], "missing_headers": ["torch/all.h"], "seconds": 0.5}])");
  ASSERT_TRUE(r) << r.error();
  ASSERT_EQ(r->size(), 1u);
  const FileReport& f = (*r)[0];
  EXPECT_EQ(f.definitions.at(0).qualified, "n::f");
  EXPECT_EQ(f.inactive.at(0), (LineSpan{7, 9}));
  EXPECT_EQ(f.diagnostics.at(0).line, 3u);
  EXPECT_EQ(f.missing_headers.at(0), "torch/all.h");
}

TEST(CxxReport, RejectsMalformedAnswers) {
  EXPECT_FALSE(parse_reports("{"));
  EXPECT_FALSE(parse_reports("{}"));
  EXPECT_FALSE(parse_reports(R"([{"ok": true, "definitions": [{"kind": "lambda", "name": "x", "begin": 1, "end": 1,
      "name_line": 1, "valid": true}], "inactive": [], "macros": [], "diagnostics": [], "missing_headers": []}])"));
  EXPECT_FALSE(parse_reports(R"([{"ok": true, "definitions": [], "inactive": [[9, 2]], "macros": [],
      "diagnostics": [], "missing_headers": []}])"));
  EXPECT_FALSE(parse_reports(R"([{"ok": true, "definitions": [{"kind": "function", "name": "x", "begin": 0,
      "end": 1, "name_line": 1, "valid": true}], "inactive": [], "macros": [], "diagnostics": [],
      "missing_headers": []}])"));
}

TEST(CxxReport, ARangeThatDoesNotHoldItsNameIsNotTrusted) {
  auto r = parse_reports(R"([{"ok": true, "definitions": [{"kind": "function", "name": "x", "begin": 5, "end": 9,
      "name_line": 2, "valid": true}], "inactive": [], "macros": [], "diagnostics": [], "missing_headers": []}])");
  ASSERT_TRUE(r);
  EXPECT_FALSE((*r)[0].definitions[0].valid);
  EXPECT_EQ((*r)[0].definitions[0].name_line, 5u);
}

// Found by fuzz_cxx_scope: an invalid definition whose name line lies past
// the file put that line into the nearest-header list the drift report reads.
TEST(CxxReport, NameLineIsPinnedInsideTheRangeEvenWhenInvalid) {
  auto r = parse_reports(R"([{"ok": true, "definitions": [{"kind": "function", "name": "made", "begin": 11,
      "end": 11, "name_line": 22, "valid": false}], "inactive": [], "macros": [], "diagnostics": [],
      "missing_headers": []}])");
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)[0].definitions[0].name_line, 11u);
}

TEST(CxxReport, KnowsCxxPaths) {
  EXPECT_TRUE(is_cxx_path("csrc/fs_io.cpp"));
  EXPECT_TRUE(is_cxx_path("csrc/a.cuh"));
  EXPECT_FALSE(is_cxx_path("vllm/x.py"));
  EXPECT_FALSE(is_cxx_path("vllm/fs_io_C.abi3.so"));
}

}  // namespace
}  // namespace cxxscope
