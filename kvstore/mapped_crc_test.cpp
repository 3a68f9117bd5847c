#include "kvtier/kvstore/mapped_crc.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "kvtier/format/crc32.h"
#include "test_tmpdir.h"

namespace kvstore {
namespace {

uint32_t crc_of(const std::string& s) {
  return kvformat::crc32(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

TEST(MappedCrc, MatchesTheBufferedChecksumFromAnyOffset) {
  testing::TmpDir t;
  std::string data;
  for (int i = 0; i < 300000; ++i) data.push_back(static_cast<char>(i * 131 + (i >> 7)));
  t.write("f", data);
  int fd = ::open((t / "f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (size_t from : {size_t{0}, size_t{1}, size_t{4096}, size_t{299999}}) {
    auto r = crc_mapped(fd, data.size(), from, 0);
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, crc_of(data.substr(from))) << from;
  }
  auto chained = crc_mapped(fd, data.size(), 100, crc_of(data.substr(0, 100)));
  ASSERT_TRUE(chained);
  EXPECT_EQ(*chained, crc_of(data));
  ::close(fd);
}

TEST(MappedCrc, FileShorterThanClaimedIsAnErrorNotACrash) {
  testing::TmpDir t;
  t.write("f", std::string(10000, 'x'));
  int fd = ::open((t / "f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  // Claims 3 pages more than the file has: touching them raises SIGBUS.
  auto r = crc_mapped(fd, 10000 + 3 * 4096, 0, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "file shrank while being read");
  ::close(fd);
}

}  // namespace
}  // namespace kvstore
