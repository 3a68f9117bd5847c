#include "kvtier/kvstore/walk.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <atomic>
#include <thread>

namespace kvstore {

Error io_error(std::string path, int err, std::string what) {
  Error e;
  e.kind = ErrorKind::kIo;
  e.path = std::move(path);
  e.err = err;
  e.message = what.empty() ? std::strerror(err) : what + ": " + std::strerror(err);
  return e;
}

FileStat to_file_stat(const struct stat& st) {
  FileStat f;
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  f.size = static_cast<uint64_t>(st.st_size);
  f.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  f.mode = st.st_mode;
  f.uid = st.st_uid;
  return f;
}

std::pair<std::string_view, std::string_view> split_parent(std::string_view rel) {
  auto slash = rel.rfind('/');
  if (slash == std::string_view::npos) return {std::string_view{}, rel};
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}

Error symlink_error(std::string path) {
  // Not strerror(ELOOP), "Too many levels of symbolic links": there is one.
  Error e = io_error(std::move(path), ELOOP, "");
  e.message = "is a symlink; kvstore does not follow links (give the path it points to)";
  return e;
}

Result<Fd> open_root(const std::string& path) {
  // O_DIRECTORY|O_NOFOLLOW on a link to a directory says ENOTDIR; say why.
  struct stat lst;
  if (::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) return symlink_error(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP) return symlink_error(path);
    if (err == ENOTDIR) return io_error(path, err, "not a directory");
    return io_error(path, err, "cannot open");
  }
  return Fd(fd);
}

namespace {

EntryType type_of_mode(mode_t m) {
  if (S_ISREG(m)) return EntryType::kFile;
  if (S_ISDIR(m)) return EntryType::kDir;
  if (S_ISLNK(m)) return EntryType::kSymlink;
  return EntryType::kOther;
}

EntryType type_of_dtype(unsigned char t) {
  switch (t) {
    case DT_REG: return EntryType::kFile;
    case DT_DIR: return EntryType::kDir;
    case DT_LNK: return EntryType::kSymlink;
    default: return EntryType::kOther;
  }
}

struct linux_dirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// Walks one directory (already open as `dfd`) and recurses; getdents64
// directly so the listing costs no more than find(1)'s.
void walk_dir(unsigned worker, int dfd, const std::string& rel, int depth, const WalkOptions& opt,
              WalkResult& out, std::vector<char>& buf) {
  std::vector<std::pair<std::string, std::string>> subdirs;  // (name, rel)
  if (opt.on_dir) opt.on_dir();
  if (opt.stat_dirs) {
    struct stat st;
    if (::fstat(dfd, &st) == 0) out.dir_stats.emplace_back(rel, to_file_stat(st));
  }
  for (;;) {
    long n = ::syscall(SYS_getdents64, dfd, buf.data(), buf.size());
    if (n < 0) {
      out.problems.push_back({rel.empty() ? "." : rel, errno, "cannot list directory"});
      break;
    }
    if (n == 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<linux_dirent64*>(buf.data() + off);
      off += d->d_reclen;
      const char* name = d->d_name;
      if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
      WalkEntry e;
      e.rel = rel.empty() ? std::string(name) : rel + "/" + name;
      e.type = type_of_dtype(d->d_type);
      bool need_stat = d->d_type == DT_UNKNOWN ||
                       (e.type != EntryType::kFile && e.type != EntryType::kDir) ||
                       (e.type == EntryType::kFile && opt.stat_files && !opt.on_file);
      if (need_stat) {
        struct stat st;
        if (::fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
          // Vanished between listing and stat (a writer's rename): not a problem.
          if (errno != ENOENT) out.problems.push_back({e.rel, errno, "cannot stat"});
          continue;
        }
        e.type = type_of_mode(st.st_mode);
        e.st = to_file_stat(st);
      }
      if (e.type == EntryType::kFile && opt.on_file && !opt.on_file(worker, dfd, name, e)) continue;
      switch (e.type) {
        case EntryType::kFile: out.files.push_back(std::move(e)); break;
        case EntryType::kDir: subdirs.emplace_back(name, std::move(e.rel)); break;
        case EntryType::kSymlink: out.links.push_back(std::move(e)); break;
        case EntryType::kOther: out.others.push_back(std::move(e)); break;
      }
    }
  }
  for (auto& [name, sub_rel] : subdirs) {
    WalkEntry e;
    e.rel = sub_rel;
    e.type = EntryType::kDir;
    if (!opt.recurse || depth < 0) {  // depth < 0: the caller walks subdirectories itself
      out.dirs.push_back(std::move(e));
      continue;
    }
    if (depth + 1 > opt.max_depth) {
      out.problems.push_back({sub_rel, ELOOP, "directory nesting too deep, not entered"});
      continue;
    }
    int sub = ::openat(dfd, name.c_str(),
                       O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (sub < 0) {
      if (errno != ENOENT) out.problems.push_back({sub_rel, errno, "cannot open directory"});
      continue;
    }
    Fd guard(sub);
    if (!opt.keep_dir || opt.keep_dir(sub_rel)) out.dirs.push_back(e);
    walk_dir(worker, sub, sub_rel, depth + 1, opt, out, buf);
  }
}

void merge_into(WalkResult& into, WalkResult&& part) {
  auto move_all = [](auto& dst, auto& src) {
    dst.insert(dst.end(), std::make_move_iterator(src.begin()), std::make_move_iterator(src.end()));
  };
  move_all(into.files, part.files);
  move_all(into.dirs, part.dirs);
  move_all(into.links, part.links);
  move_all(into.others, part.others);
  move_all(into.problems, part.problems);
  move_all(into.dir_stats, part.dir_stats);
}

}  // namespace

WalkResult walk(int root_fd, const WalkOptions& options) {
  WalkResult out;
  std::vector<char> buf(64 * 1024);
  // Walk a duplicate so the caller's fd offset is untouched.
  int dfd = ::openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    out.problems.push_back({".", errno, "cannot open directory"});
    return out;
  }
  Fd guard(dfd);
  if (options.threads <= 1 || !options.recurse) {
    walk_dir(0, dfd, "", 0, options, out, buf);
    return out;
  }
  // List the root, then hand its subdirectories to the threads.
  walk_dir(0, dfd, "", -1, options, out, buf);
  std::vector<WalkEntry> tops = out.dirs;
  if (options.keep_dir) std::erase_if(out.dirs, [&](const WalkEntry& d) { return !options.keep_dir(d.rel); });
  std::atomic<size_t> next{0};
  std::vector<WalkResult> parts(options.threads);
  auto worker = [&](unsigned t) {
    std::vector<char> b(64 * 1024);
    for (size_t i; (i = next.fetch_add(1)) < tops.size();) {
      const std::string& rel = tops[i].rel;
      if (options.max_depth < 1) {
        parts[t].problems.push_back({rel, ELOOP, "directory nesting too deep, not entered"});
        continue;
      }
      int sub = ::openat(dfd, rel.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      if (sub < 0) {
        if (errno != ENOENT) parts[t].problems.push_back({rel, errno, "cannot open directory"});
        continue;
      }
      Fd g(sub);
      walk_dir(t, sub, rel, 1, options, parts[t], b);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < options.threads; ++t) pool.emplace_back(worker, t);
  worker(0);
  for (auto& th : pool) th.join();
  for (auto& p : parts) merge_into(out, std::move(p));
  return out;
}

WalkResult list_dir(int dir_fd) {
  WalkOptions opt;
  opt.recurse = false;
  return walk(dir_fd, opt);
}

namespace {

bool openat2_unsupported = false;

// Component-by-component fallback for kernels without openat2.
int open_beneath_fallback(int root_fd, std::string_view rel, int flags) {
  int cur = ::openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cur < 0) return -1;
  size_t pos = 0;
  for (;;) {
    size_t slash = rel.find('/', pos);
    std::string comp(rel.substr(pos, slash == std::string_view::npos ? slash : slash - pos));
    if (comp.empty() || comp == "." || comp == "..") {
      ::close(cur);
      errno = EXDEV;
      return -1;
    }
    bool last = slash == std::string_view::npos;
    int f = last ? flags | O_NOFOLLOW | O_CLOEXEC
                 : O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int next = ::openat(cur, comp.c_str(), f);
    int saved = errno;
    ::close(cur);
    if (next < 0) {
      errno = saved;
      return -1;
    }
    if (last) return next;
    cur = next;
    pos = slash + 1;
  }
}

}  // namespace

Result<Fd> open_beneath(int root_fd, std::string_view rel, int flags) {
  std::string path(rel);
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos)
    return io_error(path, EXDEV, "path is not relative to the root");
  int fd = -1;
  if (!openat2_unsupported) {
    struct open_how how {};
    how.flags = static_cast<uint64_t>(flags | O_NOFOLLOW | O_CLOEXEC);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    fd = static_cast<int>(::syscall(SYS_openat2, root_fd, path.c_str(), &how, sizeof how));
    if (fd < 0 && errno == ENOSYS) openat2_unsupported = true;
  }
  if (openat2_unsupported) fd = open_beneath_fallback(root_fd, path, flags);
  if (fd < 0) {
    int err = errno;
    if (err == ELOOP) return io_error(path, err, "is or passes through a symlink");
    if (err == EXDEV) return io_error(path, err, "would leave the root");
    return io_error(path, err, "cannot open");
  }
  return Fd(fd);
}

Result<Fd> open_file_beneath(int root_fd, std::string_view rel) {
  // O_NONBLOCK so a planted fifo cannot hang us; checked to be a file below.
  auto fd = open_beneath(root_fd, rel, O_RDONLY | O_NONBLOCK);
  if (!fd) return fd;
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return io_error(std::string(rel), errno, "cannot stat");
  if (!S_ISREG(st.st_mode)) return io_error(std::string(rel), EINVAL, "not a regular file");
  return fd;
}

Result<FileStat> stat_beneath(int root_fd, std::string_view rel) {
  auto [parent, name] = split_parent(rel);
  Fd dir;
  int dfd = root_fd;
  if (!parent.empty()) {
    auto d = open_beneath(root_fd, parent, O_RDONLY | O_DIRECTORY);
    if (!d) return d.error();
    dir = std::move(*d);
    dfd = dir.get();
  }
  std::string n(name);
  if (n.empty() || n == "." || n == "..") return io_error(std::string(rel), EXDEV, "would leave the root");
  struct stat st;
  if (::fstatat(dfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return io_error(std::string(rel), errno, "cannot stat");
  return to_file_stat(st);
}

}  // namespace kvstore
