// kvformat_vectors: the C++ codec's side of the shared test vectors, for the
// Python suite (tests/python/store/test_format_vectors.py).
//
//   kvformat_vectors verdicts DIR      print {"<name>": "<verdict>", ...} for
//                                      every vector in DIR/index.json
//   kvformat_vectors encode DIR OUT    write the C++ encoding of every valid
//                                      vector to OUT/<file>
//   kvformat_vectors verify KIND FILE  print the verdict for one file
//
// Exit codes: 0 done, 1 an encode failed, 2 usage or unreadable input.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format_vectors.h"

namespace {

namespace fs = std::filesystem;

bool read_file(const fs::path& path, std::vector<std::uint8_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), {});
  return true;
}

bool load_index(const fs::path& dir, nlohmann::json& index) {
  std::vector<std::uint8_t> bytes;
  if (!read_file(dir / "index.json", bytes)) {
    std::cerr << "kvformat_vectors: cannot read " << (dir / "index.json") << "\n";
    return false;
  }
  index = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (index.is_discarded() || !index.contains("vectors")) {
    std::cerr << "kvformat_vectors: " << (dir / "index.json") << " is not a vector index\n";
    return false;
  }
  return true;
}

int usage() {
  std::cerr << "usage: kvformat_vectors verdicts DIR | encode DIR OUT | verify KIND FILE\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "verdicts") {
    nlohmann::json index;
    if (!load_index(args[1], index)) return 2;
    nlohmann::json out = nlohmann::json::object();
    for (const auto& v : index["vectors"]) {
      std::vector<std::uint8_t> data;
      const fs::path file = fs::path(args[1]) / v["file"].get<std::string>();
      if (!read_file(file, data)) {
        std::cerr << "kvformat_vectors: cannot read " << file << "\n";
        return 2;
      }
      out[v["name"].get<std::string>()] =
          kvformat::vector_verdict(v["kind"].get<std::string>(), data);
    }
    std::cout << out.dump(1) << "\n";
    return 0;
  }
  if (args.size() == 3 && args[0] == "encode") {
    nlohmann::json index;
    if (!load_index(args[1], index)) return 2;
    int status = 0;
    for (const auto& v : index["vectors"]) {
      if (!v.contains("spec")) continue;
      auto bytes = kvformat::encode_vector_spec(v["kind"].get<std::string>(), v["spec"]);
      if (!bytes) {
        std::cerr << "kvformat_vectors: " << v["name"].get<std::string>() << ": "
                  << bytes.error().message << "\n";
        status = 1;
        continue;
      }
      const fs::path out = fs::path(args[2]) / v["file"].get<std::string>();
      fs::create_directories(out.parent_path());
      std::ofstream(out, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes->data()),
                 static_cast<std::streamsize>(bytes->size()));
    }
    return status;
  }
  if (args.size() == 3 && args[0] == "verify") {
    std::vector<std::uint8_t> data;
    if (!read_file(args[2], data)) {
      std::cerr << "kvformat_vectors: cannot read " << args[2] << "\n";
      return 2;
    }
    std::cout << kvformat::vector_verdict(args[1], data) << "\n";
    return 0;
  }
  return usage();
}
