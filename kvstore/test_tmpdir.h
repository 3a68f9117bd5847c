// Test helper: a scratch directory removed after the test, plus small file
// helpers. Header-only; used by the kvstore *_test.cpp files.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kvstore::testing {

class TmpDir {
 public:
  TmpDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvstore-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

  void write(const std::string& rel, const std::string& content) const {
    auto p = std::filesystem::path(path_) / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
  }
  void mkdir(const std::string& rel) const {
    std::filesystem::create_directories(std::filesystem::path(path_) / rel);
  }
  bool exists(const std::string& rel) const {
    struct stat st;
    return ::lstat((path_ + "/" + rel).c_str(), &st) == 0;
  }

 private:
  std::string path_;
};

}  // namespace kvstore::testing
