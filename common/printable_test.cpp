#include "printable.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(Printable, KeepsPlainNamesAndUtf8) {
  EXPECT_EQ(printable("000/08_g0/ab.bin"), "000/08_g0/ab.bin");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(Printable, EscapesWhatWouldBreakALineOrATerminal) {
  EXPECT_EQ(printable("a\nb"), "a\\x0ab");
  EXPECT_EQ(printable("\x1b[31mred"), "\\x1b[31mred");
  EXPECT_EQ(printable("tab\there\x7f"), "tab\\x09here\\x7f");
  EXPECT_EQ(printable("back\\slash"), "back\\\\slash");  // so "\x41" in a name stays apart from 'A'
}

TEST(Printable, EscapesEveryByteThatIsNotUtf8) {
  EXPECT_EQ(printable("bad\xffname"), "bad\\xffname");
  EXPECT_EQ(printable("\xc3"), "\\xc3");                  // cut short
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");          // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable("\xe2\x82"), "\\xe2\\x82");
}

}  // namespace
}  // namespace kvtier
