#include "safe_folders.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace storeio {

std::optional<std::string> folder_problem(const std::string& folder) {
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    return folder + ": cannot check (" + std::strerror(errno) + ")";
  }
  if (S_ISLNK(st.st_mode)) return folder + " is a symlink";
  char shown[64];
  std::snprintf(shown, sizeof shown, " (mode %04o, uid %u)", st.st_mode & 07777u,
                static_cast<unsigned>(st.st_uid));
  if (!S_ISDIR(st.st_mode)) return folder + shown + " is not a folder";
  if (st.st_uid != 0 && st.st_uid != ::geteuid()) return folder + shown + " is owned by another user";
  const unsigned writable = st.st_mode & 022u;
  if (writable == 022u) return folder + shown + " is group- and world-writable";
  if (writable == 020u) return folder + shown + " is group-writable";
  if (writable == 002u) return folder + shown + " is world-writable";
  return std::nullopt;
}

std::optional<std::string> chunk_folders_problem(const char* chunk_path) {
  std::string folder(chunk_path);
  for (int level = 0; level < 2; ++level) {
    const auto slash = folder.rfind('/');
    if (slash == std::string::npos || slash == 0) return std::nullopt;
    folder.resize(slash);
    if (auto problem = folder_problem(folder)) return problem;
  }
  return std::nullopt;
}

}  // namespace storeio
