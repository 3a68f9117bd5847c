#include "resolve.h"

#include <gtest/gtest.h>

namespace cxxscope {
namespace {

Definition def(std::string kind, std::string name, size_t b, size_t e, bool valid = true, std::string q = "") {
  Definition d;
  d.kind = kind;
  d.name = name;
  d.qualified = q.empty() ? name : q;
  d.begin = b;
  d.end = e;
  d.name_line = b;
  d.valid = valid;
  if (!valid) d.why = "written by a macro";
  return d;
}

// namespace vllm (reopened twice), a struct with a method, free functions.
std::vector<Definition> sample() {
  return {def("namespace", "vllm", 10, 40),          def("function", "swap", 12, 20, true, "vllm::swap"),
          def("struct", "Op", 22, 30),               def("method", "run", 24, 28, true, "vllm::Op::run"),
          def("function", "swap", 50, 60),           def("namespace", "vllm", 70, 90),
          def("function", "gather", 72, 80, true, "vllm::gather"), def("function", "macro_made", 95, 99, false)};
}

TEST(CxxScope, SyntaxAcceptsKindsAndRejectsTheRest) {
  EXPECT_EQ(scope_syntax_error("namespace vllm/fn swap_blocks_batch"), "");
  EXPECT_EQ(scope_syntax_error("namespace (anonymous)/fn f"), "");
  EXPECT_EQ(scope_syntax_error("fn Op::run"), "");
  EXPECT_EQ(scope_syntax_error("struct Op/fn run"), "");
  EXPECT_NE(scope_syntax_error(""), "");
  EXPECT_NE(scope_syntax_error("def f"), "");
  EXPECT_NE(scope_syntax_error("fn"), "");
  EXPECT_NE(scope_syntax_error("fn 9lives"), "");
  EXPECT_NE(scope_syntax_error("fn a//fn b"), "");
  EXPECT_NE(scope_syntax_error("class (anonymous)"), "");
  EXPECT_NE(scope_syntax_error("fn A::"), "");
}

TEST(CxxScope, ResolvesNestedAndQualified) {
  auto r = resolve_scope(sample(), "namespace vllm/struct Op/fn run", 100);
  ASSERT_TRUE(r.ok) << r.refusal;
  EXPECT_EQ(r.begin, 23u);
  EXPECT_EQ(r.end, 28u);
  r = resolve_scope(sample(), "fn Op::run", 100);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.begin, 23u);
}

TEST(CxxScope, ReopenedNamespaceIsSearchedWhole) {
  auto r = resolve_scope(sample(), "namespace vllm/fn gather", 100);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(r.begin, 71u);
  EXPECT_EQ(r.end, 80u);
  // But a reopened namespace as the last segment is ambiguous.
  r = resolve_scope(sample(), "namespace vllm", 100);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.found.size(), 2u);
}

TEST(CxxScope, AmbiguousAndMissingAreNotGuessed) {
  auto r = resolve_scope(sample(), "fn swap", 100);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.found.size(), 2u);
  r = resolve_scope(sample(), "namespace vllm/fn swap", 100);
  EXPECT_TRUE(r.ok);  // only one swap inside vllm
  r = resolve_scope(sample(), "namespace vllm/fn swapp", 100);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(r.found.empty());
  EXPECT_FALSE(r.headers.empty());  // candidates for the nearest-match report
  EXPECT_EQ(r.segment, "fn swapp");
}

TEST(CxxScope, InvalidRangeIsRefused) {
  auto r = resolve_scope(sample(), "fn macro_made", 100);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.refusal.find("refusing to guess"), std::string::npos);
  EXPECT_NE(r.refusal.find("macro"), std::string::npos);
}

TEST(CxxScope, OutOfFileRangesAreIgnored) {
  std::vector<Definition> defs = {def("function", "f", 5, 500)};
  EXPECT_FALSE(resolve_scope(defs, "fn f", 100).ok);
}

TEST(CxxScope, AnchorInInactiveOrMacroLinesIsRefused) {
  FileReport rep;
  rep.inactive = {{10, 20}};
  rep.macros = {{30, 33}};
  EXPECT_EQ(anchor_refusal(rep, 0, 9), "");             // lines 1-9
  EXPECT_NE(anchor_refusal(rep, 8, 3), "");             // lines 9-11 touch the branch
  EXPECT_NE(anchor_refusal(rep, 31, 1).find("#define"), std::string::npos);  // line 32
  EXPECT_EQ(anchor_refusal(rep, 33, 1), "");            // line 34
}

}  // namespace
}  // namespace cxxscope
