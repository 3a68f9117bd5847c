#include "text.h"

#include <gtest/gtest.h>

namespace patcher {
namespace {

TEST(Text, SplitJoinRoundTripsWithAndWithoutFinalNewline) {
  for (std::string s : {"", "a", "a\n", "a\nb", "a\nb\n", "\n", "\n\n"}) EXPECT_EQ(join_lines(split_lines(s)), s) << s;
}

TEST(Text, Utf8Validation) {
  EXPECT_FALSE(find_invalid_utf8("plain ascii, caf\xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80"));
  EXPECT_EQ(find_invalid_utf8("ok\xff"), 2u);
  EXPECT_TRUE(find_invalid_utf8("\xc0\xaf"));          // overlong
  EXPECT_TRUE(find_invalid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_TRUE(find_invalid_utf8("\xe2\x82"));          // truncated
}

TEST(Text, CrLineAndReindent) {
  EXPECT_EQ(find_cr_line("a\nb\r\n"), 2u);
  EXPECT_FALSE(find_cr_line("a\nb\n"));
  EXPECT_EQ(reindent({"if x:", "    y()", "", "z"}, "    "),
            (std::vector<std::string>{"    if x:", "        y()", "", "    z"}));
}

}  // namespace
}  // namespace patcher
