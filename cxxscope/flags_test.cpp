#include "flags.h"

#include <gtest/gtest.h>

namespace cxxscope {
namespace {

using V = std::vector<std::string>;

TEST(CxxFlags, KeepsWhatClangNeedsFromAnNvccLine) {
  V argv = {"/usr/local/cuda/bin/nvcc", "-DTORCH_EXTENSION_NAME=_C", "-I/abs/inc", "-Irel", "-isystem",
            "/usr/include/torch", "-D", "X=1", "-UY", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90",
            "-Xcompiler=-fPIC", "--expt-relaxed-constexpr", "-include", "pre.h", "-c", "a.cu", "-o", "a.o"};
  EXPECT_EQ(filter_flags(argv, "/build"),
            (V{"-DTORCH_EXTENSION_NAME=_C", "-I/abs/inc", "-I/build/rel", "-isystem", "/usr/include/torch", "-D", "X=1",
               "-UY", "-std=c++17", "-include", "/build/pre.h"}));
}

TEST(CxxFlags, SplitsCommandsLikeAShell) {
  EXPECT_EQ(split_command(R"(c++ -DA="x y" '-DB=1 2' -DC=a\ b  -c f.cpp)"),
            (V{"c++", "-DA=x y", "-DB=1 2", "-DC=a b", "-c", "f.cpp"}));
}

TEST(CxxFlags, FindsTheEntryForTheFile) {
  const char* db = R"([
    {"directory": "/b", "file": "other.cpp", "command": "c++ -DOTHER -c other.cpp"},
    {"directory": "/b", "file": "/src/csrc/fs_io.cpp", "arguments": ["c++", "-Icsrc", "-O2", "-c", "x"]}
  ])";
  auto f = flags_from_compile_commands(db, "/src/csrc/fs_io.cpp");
  ASSERT_TRUE(f) << f.error();
  EXPECT_EQ(*f, (V{"-I/b/csrc"}));
  auto o = flags_from_compile_commands(db, "/b/other.cpp");
  ASSERT_TRUE(o);
  EXPECT_EQ(*o, (V{"-DOTHER"}));
  auto missing = flags_from_compile_commands(db, "/nope.cpp");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("no entry for /nope.cpp"), std::string::npos);
  EXPECT_FALSE(flags_from_compile_commands("{", "/a"));
  EXPECT_FALSE(flags_from_compile_commands("{}", "/a"));
}

}  // namespace
}  // namespace cxxscope
