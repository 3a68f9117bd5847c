// A file holding given bytes, opened for the fd readers' tests and removed
// after (test-only helper).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

namespace kvformat::testing {

class TempFile {
 public:
  explicit TempFile(const std::vector<std::uint8_t>& data) {
    char name[] = "/tmp/kvformat_test_XXXXXX";
    fd_ = mkstemp(name);
    path_ = name;
    EXPECT_EQ(write(fd_, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  }
  ~TempFile() {
    close(fd_);
    unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace kvformat::testing
