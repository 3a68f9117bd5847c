// Test-only helpers: a scratch folder, files in it, and read/write items
// that point at a chunk built by format/test_chunk_builder.h.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kvtier/format/header.h"
#include "kvtier/store_abi.h"

namespace storeio::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "storeio-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      out.push_back(e.path().filename().string());
    return out;
  }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::vector<kvtier_segment> abi_segments(const std::vector<kvformat::Segment>& segs) {
  std::vector<kvtier_segment> out;
  for (const auto& s : segs) {
    kvtier_segment e{};
    e.layer = s.layer;
    e.kind = static_cast<std::uint8_t>(s.kind);
    e.dtype = static_cast<std::uint8_t>(s.dtype);
    e.ndim = static_cast<std::uint8_t>(s.shape.size());
    e.part = s.part;
    e.offset = s.offset;
    e.length = s.length;
    for (std::size_t i = 0; i < s.shape.size(); ++i) {
      e.shape[i] = s.shape[i];
      e.stride[i] = s.stride[i];
    }
    out.push_back(e);
  }
  return out;
}

}  // namespace storeio::testing
