#include "paths.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fault.h"

namespace patcher {

std::string errno_text(int err) { return std::strerror(err); }

Status validate_rel_path(std::string_view rel, const std::string& manifest_file, const char* what) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorKind::Usage, manifest_file,
                      std::string(what) + " \"" + std::string(rel) + "\" " + why);
  };
  if (rel.empty()) return bad("is empty");
  if (rel.front() == '/') return bad("is absolute; paths must be relative to the root");
  if (rel.size() > 4000) return bad("is longer than 4000 bytes");
  for (char c : rel)
    if (c == '\0' || c == '\n' || c == '\r' || c == '\\') return bad("contains a forbidden character");
  size_t start = 0;
  while (true) {
    size_t slash = rel.find('/', start);
    std::string_view comp = rel.substr(start, slash == std::string_view::npos ? rel.npos : slash - start);
    if (comp.empty()) return bad("has an empty component");
    if (comp == "..") return bad("escapes the root through \"..\"");
    if (comp == ".") return bad("contains a \".\" component");
    if (comp.size() > 255) return bad("has a component longer than 255 bytes");
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return ok_status();
}

std::string base_name(std::string_view rel) {
  size_t s = rel.rfind('/');
  return std::string(s == rel.npos ? rel : rel.substr(s + 1));
}

std::string dir_name(std::string_view rel) {
  size_t s = rel.rfind('/');
  return s == rel.npos ? std::string() : std::string(rel.substr(0, s));
}

Result<Tree> Tree::open(const std::string& root) {
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR || e == ENAMETOOLONG)
      return make_error(ErrorKind::Usage, root, "root is not a directory: " + errno_text(e));
    return make_error(ErrorKind::Io, root, "cannot open root: " + errno_text(e));
  }
  Tree t;
  t.root_ = root;
  t.fd_ = Fd(fd);
  return t;
}

Result<std::optional<Fd>> Tree::open_parent(std::string_view rel) const {
  Fd cur(::dup(fd_.get()));
  size_t start = 0;
  std::string walked;
  while (true) {
    size_t slash = rel.find('/', start);
    if (slash == std::string_view::npos) break;
    std::string comp(rel.substr(start, slash - start));
    walked += (walked.empty() ? "" : "/") + comp;
    int fd = ::openat(cur.get(), comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      if (e == ENOENT) return std::optional<Fd>();
      if (e == ELOOP || e == ENOTDIR) {
        struct stat st {};
        if (::fstatat(cur.get(), comp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
          return make_error(ErrorKind::Usage, std::string(rel),
                            "path goes through a symlink (\"" + walked + "\"); refusing to follow it");
        return make_error(ErrorKind::Usage, std::string(rel), "\"" + walked + "\" is not a directory");
      }
      if (e == ENAMETOOLONG) return make_error(ErrorKind::Usage, std::string(rel), "name too long");
      return make_error(ErrorKind::Io, std::string(rel), "cannot open directory \"" + walked + "\": " + errno_text(e));
    }
    cur = Fd(fd);
    start = slash + 1;
  }
  return std::optional<Fd>(std::move(cur));
}

Result<FileData> read_fd(int fd, const std::string& display) {
  FileData d;
  if (::fstat(fd, &d.st) != 0) return make_error(ErrorKind::Io, display, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(d.st.st_mode)) return make_error(ErrorKind::Usage, display, "is not a regular file");
  if (int e = fault("read")) return make_error(ErrorKind::Io, display, "cannot read: " + errno_text(e));
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorKind::Io, display, "cannot read: " + errno_text(errno));
    }
    if (n == 0) break;
    d.bytes.append(buf, static_cast<size_t>(n));
  }
  return d;
}

Result<std::optional<FileData>> Tree::read(std::string_view rel) const {
  auto parent = open_parent(rel);
  if (!parent) return parent.error();
  if (!parent->has_value()) return std::optional<FileData>();
  std::string name = base_name(rel);
  int fd = ::openat((*parent)->get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return std::optional<FileData>();
    if (e == ELOOP) return make_error(ErrorKind::Usage, std::string(rel), "is a symlink; refusing to follow it");
    if (e == ENAMETOOLONG) return make_error(ErrorKind::Usage, std::string(rel), "name too long");
    return make_error(ErrorKind::Io, std::string(rel), "cannot open: " + errno_text(e));
  }
  Fd owned(fd);
  auto d = read_fd(fd, std::string(rel));
  if (!d) return d.error();
  return std::optional<FileData>(std::move(*d));
}

Result<bool> Tree::exists(std::string_view rel) const {
  auto parent = open_parent(rel);
  if (!parent) return parent.error();
  if (!parent->has_value()) return false;
  struct stat st {};
  std::string name = base_name(rel);
  if (::fstatat((*parent)->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  if (errno == ENOENT) return false;
  return make_error(ErrorKind::Io, std::string(rel), "cannot stat: " + errno_text(errno));
}

}  // namespace patcher

namespace patcher {

Result<mode_t> Tree::type(std::string_view rel) const {
  auto parent = open_parent(rel);
  if (!parent) return parent.error();
  if (!parent->has_value()) return mode_t{0};
  struct stat st {};
  std::string name = base_name(rel);
  if (::fstatat((*parent)->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return mode_t(st.st_mode & S_IFMT);
  if (errno == ENOENT) return mode_t{0};
  return make_error(ErrorKind::Io, std::string(rel), "cannot stat: " + errno_text(errno));
}

Result<std::vector<std::string>> list_dir(int dirfd, const std::string& display) {
  int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorKind::Io, display, "cannot open folder: " + errno_text(errno));
  DIR* d = ::fdopendir(fd);
  if (!d) {
    int e = errno;
    ::close(fd);
    return make_error(ErrorKind::Io, display, "cannot list folder: " + errno_text(e));
  }
  std::vector<std::string> out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

}  // namespace patcher
