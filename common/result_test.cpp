#include "result.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <variant>

namespace {

struct Err {
  std::string message;
};
template <class T>
using Result = kvtier::Result<T, Err>;
using Status = kvtier::Result<void, Err>;

Result<int> half(int x) {
  if (x % 2) return Err{"odd"};
  return x / 2;
}

Status even(int x) {
  if (x % 2) return Err{"odd"};
  return {};
}

TEST(Result, ValueAndError) {
  auto a = half(4);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 2);
  auto b = half(3);
  ASSERT_FALSE(b);
  EXPECT_EQ(b.error().message, "odd");
  EXPECT_THROW((void)b.value(), std::bad_variant_access);
  EXPECT_THROW((void)a.error(), std::bad_variant_access);
}

TEST(Result, VoidStatus) {
  EXPECT_TRUE(even(2).ok());
  Status s = even(1);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message, "odd");
  EXPECT_THROW((void)even(2).error(), std::bad_variant_access);
}

TEST(Result, MoveOnlyValue) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r);
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

}  // namespace
