// load_key_file (key_file.h): the race the first look cannot see. A FIFO
// swapped in between the lstat and the open is refused on the descriptor,
// never waited on (the open does not block). The plain refusals are tested
// through the store library (storeio/names_test.cpp) and the overlays.
#include "kvtier/format/key_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

namespace kvformat {
namespace {

TEST(KeyFile, AFifoSwappedInAfterTheFirstLookIsRefusedNotWaitedOn) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvformat_key_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path key = dir / "key", fifo = dir / "fifo";
  std::FILE* f = std::fopen(key.c_str(), "w");
  for (int i = 1; i <= 32; ++i) std::fputc(i, f);
  std::fclose(f);
  ::chmod(key.c_str(), 0600);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);

  std::vector<std::uint8_t> bytes;
  EXPECT_EQ(load_key_file(key, bytes), "");
  EXPECT_EQ(bytes.size(), 32u);
  const std::string problem =
      load_key_file(key, bytes, "", [&] { fs::rename(fifo, key); });  // the swap
  EXPECT_EQ(problem, "key file " + key.string() + " changed while opened: refused");
  EXPECT_TRUE(bytes.empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvformat
