#include "kvtier/kvstore/store_perms.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace kvstore {
namespace {

// ROOT as an absolute path, lexically ('.' and '..' resolved by name: a
// symlink on the way is what the check itself refuses).
std::vector<std::string> components(const std::string& root) {
  std::string path = root;
  if (path.empty() || path[0] != '/') {
    std::vector<char> cwd(PATH_MAX);
    if (::getcwd(cwd.data(), cwd.size())) path = std::string(cwd.data()) + "/" + path;
  }
  std::vector<std::string> parts;
  std::size_t i = 0;
  while (i <= path.size()) {
    const std::size_t j = std::min(path.find('/', i), path.size());
    const std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  return parts;
}

std::string joined(const std::vector<std::string>& parts, std::size_t n) {
  if (n == 0) return "/";
  std::string out;
  for (std::size_t k = 0; k < n; ++k) out += "/" + parts[k];
  return out;
}

std::optional<std::string> folder_problem(const std::string& path, const struct stat& st, bool is_store,
                                          uid_t serving) {
  const unsigned mode = st.st_mode & 07777;
  const std::string shown = fmt::format("{} (mode {:04o}, uid {})", path, mode, st.st_uid);
  if (S_ISLNK(st.st_mode)) return path + " is a symlink";
  if (!S_ISDIR(st.st_mode)) return shown + " is not a folder";
  if (st.st_uid != 0 && st.st_uid != serving) return shown + " is owned by another user";
  if (mode & 022) {
    const bool sticky_root = st.st_uid == 0 && (mode & S_ISVTX);
    if (is_store || !sticky_root) {
      const char* who = (mode & 022) == 022 ? "group- and world" : (mode & 020) ? "group" : "world";
      return fmt::format("{} is {}-writable", shown, who);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> unsafe_store_folder(const std::string& root, uid_t serving_uid) {
  const auto parts = components(root);
  for (std::size_t n = parts.size() + 1; n-- > 0;) {
    const std::string path = joined(parts, n);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;
      return fmt::format("{}: cannot check ({})", path, std::strerror(errno));
    }
    if (auto p = folder_problem(path, st, n == parts.size(), serving_uid)) return p;
  }
  return std::nullopt;
}

std::optional<std::string> unsafe_inner_folder(const std::string& shown, uint32_t mode, uid_t uid,
                                               uid_t serving_uid) {
  struct stat st {};
  st.st_mode = static_cast<mode_t>(mode);
  st.st_uid = uid;
  return folder_problem(shown, st, /*is_store=*/true, serving_uid);
}

uid_t serving_uid_for(const std::string& root) {
  const uid_t me = ::geteuid();
  struct stat st;
  if (me == 0 && ::lstat(root.c_str(), &st) == 0) return st.st_uid;
  return me;
}

}  // namespace kvstore
