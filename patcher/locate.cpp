#include "locate.h"

#include <dirent.h>
#include <sys/stat.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "paths.h"

namespace patcher {
namespace {

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Result<std::string> find_anchors_root(const std::string& exe_path) {
  std::string dir = exe_path.substr(0, exe_path.rfind('/'));
  // Installed (GNUInstallDirs: <prefix>/bin + <prefix>/share/kvtier), or a flat
  // prefix (<prefix>/bin + <prefix>/anchors), which a build folder also is: CMake
  // links anchors/ into it (patcher/CMakeLists.txt).
  std::vector<std::string> candidates = {dir + "/../share/kvtier/anchors", dir + "/../anchors"};
  for (const auto& c : candidates)
    if (is_dir(c)) return c;
  // Started as `ld.so overlay ...`: /proc/self/exe is the loader, not us.
  std::string why = base_name(exe_path).rfind("ld-", 0) == 0 ? " (the executable is the dynamic loader)" : "";
  return make_error(ErrorKind::Usage, exe_path,
                    "cannot find the anchors folder" + why +
                        " (looked in ../share/kvtier/anchors and ../anchors); pass --manifests DIR");
}

Result<std::string> detect_engine_version(const std::string& root, const std::string& engine) {
  std::string dist_prefix = engine;
  for (auto& c : dist_prefix)
    if (c == '-') c = '_';
  if (DIR* d = ::opendir(root.c_str())) {
    std::vector<std::string> metas;
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      const std::string suffix = ".dist-info";
      bool name_ok = n.rfind(engine + "-", 0) == 0 || n.rfind(dist_prefix + "-", 0) == 0;
      if (name_ok && n.size() > suffix.size() && n.substr(n.size() - suffix.size()) == suffix)
        metas.push_back(root + "/" + n + "/METADATA");
    }
    ::closedir(d);
    std::regex ver_line(R"(^Version:\s*(\S+)\s*$)");
    for (const auto& m : metas) {
      std::istringstream in(slurp(m));
      std::string line;
      std::smatch sm;
      while (std::getline(in, line))
        if (std::regex_match(line, sm, ver_line)) return sm[1].str();
    }
  }
  std::regex assign(R"((?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([0-9][^'"]*)['"])");
  for (const char* f : {"/_version.py", "/version.py"}) {
    std::string text = slurp(root + "/" + engine + f);
    std::smatch sm;
    if (!text.empty() && std::regex_search(text, sm, assign)) return sm[1].str();
  }
  return make_error(ErrorKind::Usage, root,
                    "cannot detect the " + engine + " version: no " + engine + "-*.dist-info/METADATA, " + engine +
                        "/_version.py or " + engine + "/version.py with a version; pass --engine-version or --manifests");
}

}  // namespace patcher
