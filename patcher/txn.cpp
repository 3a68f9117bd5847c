// Why one file over 500 lines: the journal, the commit point, recovery and discard are
// one crash-safety argument; kept together it reads top to bottom in the order of the writes.
#include "txn.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <set>

#include "fault.h"
#include "sha256.h"
#include "text.h"

namespace patcher {

std::string temp_name_for(const std::string& rel) {
  std::string dir = dir_name(rel);
  return (dir.empty() ? "" : dir + "/") + "." + base_name(rel) + ".overlay-tmp";
}

std::string saved_name_for(const std::string& rel) {
  std::string dir = dir_name(rel);
  return (dir.empty() ? "" : dir + "/") + "." + base_name(rel) + ".overlay-old";
}

const char* change_kind_name(Change::Kind k) {
  switch (k) {
    case Change::Write: return "write";
    case Change::Create: return "create";
    case Change::Delete: return "delete";
    case Change::Mkdir: return "mkdir";
    case Change::Rmdir: return "rmdir";
  }
  return "?";
}

Change write_change(const std::string& path, const FileData& old, std::string new_bytes) {
  Change c;
  c.kind = Change::Write;
  c.path = path;
  c.old_sha = kvtier::sha256_hex(old.bytes);
  c.new_bytes = std::move(new_bytes);
  c.mode = old.st.st_mode;
  c.keep_owner = true;
  c.uid = old.st.st_uid;
  c.gid = old.st.st_gid;
  return c;
}

Change create_change(const std::string& path, std::string bytes) {
  Change c;
  c.kind = Change::Create;
  c.path = path;
  c.new_bytes = std::move(bytes);
  c.mode = 0644;
  return c;
}

Change delete_change(const std::string& path, const std::string& old_sha) {
  Change c;
  c.kind = Change::Delete;
  c.path = path;
  c.old_sha = old_sha;
  return c;
}

Change mkdir_change(const std::string& dir, const struct stat& parent) {
  Change c;
  c.kind = Change::Mkdir;
  c.path = dir;
  c.mode = parent.st_mode & 07777;
  c.keep_owner = true;
  c.uid = parent.st_uid;
  c.gid = parent.st_gid;
  return c;
}

Change rmdir_change(const std::string& dir) {
  Change c;
  c.kind = Change::Rmdir;
  c.path = dir;
  return c;
}

namespace {

constexpr const char* kMarkerText = "# folder created by overlay; overlay revert removes it once it holds nothing else\n";

Error io(const std::string& file, const std::string& what, int err) {
  return make_error(ErrorKind::Io, file, what + ": " + errno_text(err));
}

bool is_under(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

// Writes all of `data`; the fault step fires after the first half.
Status write_all(int fd, const std::string& data, const std::string& display, const char* step) {
  size_t half = data.size() / 2, done = 0;
  bool fired = false;
  while (done < data.size() || !fired) {
    if (!fired && done >= half) {
      fired = true;
      if (int e = fault(step)) return io(display, "cannot write", e);
      continue;
    }
    size_t limit = done < half ? half : data.size();
    ssize_t n = ::write(fd, data.data() + done, limit - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io(display, "cannot write", errno);
    }
    done += static_cast<size_t>(n);
  }
  return ok_status();
}

Status fsync_dir(int fd, const std::string& display) {
  if (int e = fault("dir-fsync")) return io(display, "cannot fsync directory", e);
  if (::fsync(fd) != 0) return io(display, "cannot fsync directory", errno);
  return ok_status();
}

// rename that never replaces an existing entry (a file or folder someone put
// there is not ours to overwrite).
int rename_noreplace(int dir_from, const char* from, int dir_to, const char* to) {
  if (::renameat2(dir_from, from, dir_to, to, RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return -1;
  struct stat st {};
  if (::fstatat(dir_to, to, &st, AT_SYMLINK_NOFOLLOW) == 0) {
    errno = EEXIST;
    return -1;
  }
  return ::renameat(dir_from, from, dir_to, to);
}

// Removes `name` under `dirfd`, a folder the engine made (a staging folder):
// files, then folders, never following a link.
void remove_tree(int dirfd, const std::string& name) {
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    Fd owned(fd);
    if (auto names = list_dir(fd, name))
      for (const auto& n : *names)
        if (::unlinkat(fd, n.c_str(), 0) != 0 && (errno == EISDIR || errno == EPERM)) remove_tree(fd, n);
  }
  ::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR);
}

// Removes the folder `name` under `parent` when it holds nothing but the
// marker. True when it is gone.
bool remove_if_only_marker(int parent, const std::string& name) {
  int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  Fd owned(fd);
  auto names = list_dir(fd, name);
  if (!names) return false;
  for (const auto& n : *names)
    if (n != kDirMarker) return false;
  ::unlinkat(fd, kDirMarker, 0);
  return ::unlinkat(parent, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT;
}

// Removes folder `name` under `parent` when it holds nothing but markers and
// folders that are removable in the same way. True when it is gone.
bool remove_marked_tree(int parent, const std::string& name) {
  int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  Fd owned(fd);
  auto names = list_dir(fd, name);
  if (!names) return false;
  for (const auto& n : *names) {
    if (n == kDirMarker) continue;
    struct stat st {};
    if (::fstatat(fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) return false;
    if (!remove_marked_tree(fd, n)) return false;
  }
  ::unlinkat(fd, kDirMarker, 0);
  return ::unlinkat(parent, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT;
}

// Creates folder `name` under `parent` with the marker inside; returns its fd.
Result<Fd> make_marked_dir(int parent, const std::string& name, const Change& spec, const std::string& display) {
  if (int e = fault("mkdir")) return io(display, "cannot create the folder", e);
  if (::mkdirat(parent, name.c_str(), 0700) != 0) return io(display, "cannot create the folder", errno);
  int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return io(display, "cannot open the new folder", errno);
  Fd dir(fd);
  int m = ::openat(dir.get(), kDirMarker, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (m < 0) return io(display, "cannot write the folder marker", errno);
  Fd marker(m);
  if (auto s = write_all(m, kMarkerText, display + "/" + kDirMarker, "marker-write"); !s) return s.error();
  if (::fsync(m) != 0) return io(display, "cannot fsync the folder marker", errno);
  if (spec.keep_owner && ::fchown(dir.get(), spec.uid, spec.gid) != 0)
    return io(display, "cannot give the new folder its parent's owner", errno);
  if (::fchmod(dir.get(), spec.mode & 07777) != 0) return io(display, "cannot set the new folder's mode", errno);
  return dir;
}

// Per change: where it acts.
struct Slot {
  Fd dir;             // the folder holding the target (for Mkdir/Rmdir: the parent)
  std::string base;   // target name in `dir`
  std::string tmp;    // temp file or staging folder name in `dir`
  std::string saved;  // saved-old link name in `dir`
  int staged_by = -1;  // a Create inside a new folder: index of that folder's Mkdir
  bool made_tmp = false, made_saved = false;
};

std::string journal_text(const std::vector<Change>& changes) {
  std::string j = "overlay-journal 2\n";
  for (const auto& c : changes) {
    bool has_new = c.kind == Change::Write || c.kind == Change::Create;
    bool has_old = c.kind == Change::Write || c.kind == Change::Delete;
    j += std::string(change_kind_name(c.kind)) + " " + (has_new ? kvtier::sha256_hex(c.new_bytes) : "-") + " " +
         (has_old ? c.old_sha : "-") + " " + c.path + "\n";
  }
  j += "end " + std::to_string(changes.size()) + "\n";
  return j;
}

// What can be checked before the commit point is checked here, so that a
// failure after it (which leaves a journal to finish) needs a change in the
// world between the two: every folder written to is writable, no file
// replaced or deleted is immutable or append-only, and each file system has
// room for the temps and the journal.
Status preflight(const Tree& tree, const std::vector<Change>& changes, const std::vector<Slot>& slots) {
  std::map<dev_t, std::pair<unsigned long long, unsigned long long>> need;  // bytes, inodes
  std::map<dev_t, int> dev_fd;
  auto writable = [&](int fd, const std::string& display) -> Status {
    int e = fault("preflight-dir");
    if (!e && ::faccessat(fd, ".", W_OK, AT_EACCESS) != 0) e = errno;
    if (e) return io(display, "folder is not writable (nothing was written)", e);
    return ok_status();
  };
  if (auto s = writable(tree.fd(), "."); !s) return s;
  std::set<int> checked;
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    // A file inside a folder this transaction builds lands on that folder's parent's file system.
    const Slot& sl = slots[i].staged_by >= 0 ? slots[static_cast<size_t>(slots[i].staged_by)] : slots[i];
    std::string folder = dir_name(c.path);
    if (slots[i].staged_by < 0 && checked.insert(sl.dir.get()).second)
      if (auto s = writable(sl.dir.get(), folder.empty() ? "." : folder); !s) return s;
    if (c.kind == Change::Write || c.kind == Change::Delete) {
      int fd = ::openat(sl.dir.get(), sl.base.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) {
        Fd owned(fd);
        int flags = 0;
        int e = fault("preflight-file");
        if (e == 0 && ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 && (flags & (FS_IMMUTABLE_FL | FS_APPEND_FL))) e = EPERM;
        if (e)
          return make_error(ErrorKind::Io, c.path,
                            "cannot be replaced: the file is immutable or append-only (chattr -i/-a it first; "
                            "nothing was written): " + errno_text(e));
      }
    }
    struct stat st {};
    if (::fstat(sl.dir.get(), &st) != 0) return io(folder, "cannot stat the folder", errno);
    dev_fd.emplace(st.st_dev, sl.dir.get());
    auto& n = need[st.st_dev];
    n.first += c.new_bytes.size() + 4096;  // a block of slack per file for metadata
    n.second += 2;
  }
  struct stat root_st {};
  if (::fstat(tree.fd(), &root_st) == 0) {
    dev_fd.emplace(root_st.st_dev, tree.fd());
    need[root_st.st_dev].first += 64 * 1024;  // the journal
    need[root_st.st_dev].second += 2;
  }
  for (const auto& [dev, n] : need) {
    struct statvfs vs {};
    int e = fault("preflight-space");
    if (!e && ::fstatvfs(dev_fd[dev], &vs) != 0) continue;  // cannot tell: the writes will say
    unsigned long long avail =
        e ? 0 : (::geteuid() == 0 ? vs.f_bfree : vs.f_bavail) * static_cast<unsigned long long>(vs.f_frsize);
    unsigned long long inodes = e ? 0 : (::geteuid() == 0 ? vs.f_ffree : vs.f_favail);
    bool inode_limited = e == 0 && vs.f_files > 0;
    if (avail < n.first || (inode_limited && inodes < n.second) || e)
      return make_error(ErrorKind::Io, tree.root(),
                        "not enough free space: the transaction needs " + std::to_string(n.first) + " bytes and " +
                            std::to_string(n.second) + " inodes, the file system has " + std::to_string(avail) +
                            " bytes and " + std::to_string(inodes) + " inodes free (nothing was written)");
  }
  return ok_status();
}

}  // namespace

Status commit(const Tree& tree, const std::vector<Change>& changes) {
  if (changes.empty()) return ok_status();
  std::vector<Slot> slots(changes.size());
  std::vector<Fd> staged_dirs;  // folders created inside staging folders, for fsync
  auto cleanup = [&]() {
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      if (s.made_saved) ::unlinkat(s.dir.get(), s.saved.c_str(), 0);
      if (!s.made_tmp) continue;
      if (changes[i].kind == Change::Mkdir)
        remove_tree(s.dir.get(), s.tmp);
      else
        ::unlinkat(s.dir.get(), s.tmp.c_str(), 0);
    }
    ::unlinkat(tree.fd(), kJournalTemp, 0);
  };
  auto fail = [&](Error e) -> Status {
    cleanup();
    return e;
  };
  // Where each change acts.
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    if (c.kind == Change::Create)
      for (size_t j = 0; j < changes.size(); ++j)
        if (changes[j].kind == Change::Mkdir && is_under(c.path, changes[j].path)) slots[i].staged_by = static_cast<int>(j);
    if (slots[i].staged_by >= 0) continue;
    auto parent = tree.open_parent(c.path);
    if (!parent) return fail(parent.error());
    if (!parent->has_value()) return fail(make_error(ErrorKind::Drift, c.path, "parent folder does not exist"));
    slots[i].dir = std::move(**parent);
    slots[i].base = base_name(c.path);
    slots[i].tmp = base_name(temp_name_for(c.path));
    slots[i].saved = base_name(saved_name_for(c.path));
  }
  if (auto s = preflight(tree, changes, slots); !s) return fail(s.error());
  // 1. staging folders, temps, saved old bytes
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    Slot& sl = slots[i];
    if (c.kind == Change::Rmdir) continue;
    if (c.kind == Change::Mkdir) {
      auto d = make_marked_dir(sl.dir.get(), sl.tmp, c, c.path);
      sl.made_tmp = d.ok();
      if (!d) return fail(d.error());
      staged_dirs.push_back(std::move(*d));
      continue;
    }
    if (c.kind == Change::Write || c.kind == Change::Delete) {
      // A hard link keeps the old bytes for `recover --discard`; where links
      // are not supported the transaction still works, it just cannot be
      // rolled back by the tool.
      ::unlinkat(sl.dir.get(), sl.saved.c_str(), 0);
      if (fault("link-old") == 0 && ::linkat(sl.dir.get(), sl.base.c_str(), sl.dir.get(), sl.saved.c_str(), 0) == 0)
        sl.made_saved = true;
      if (c.kind == Change::Delete) continue;
    }
    int into = sl.dir.get();
    std::string name = sl.tmp;
    if (sl.staged_by >= 0) {
      // Inside a new folder: build the folders between it and the file, then
      // write the file under its final name (the folder is not visible yet).
      const Change& mk = changes[static_cast<size_t>(sl.staged_by)];
      Slot& mks = slots[static_cast<size_t>(sl.staged_by)];
      int fd = ::openat(mks.dir.get(), mks.tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return fail(io(mk.path, "cannot open the staging folder", errno));
      Fd cur(fd);
      std::string rest = c.path.substr(mk.path.size() + 1), walked = mk.path;
      for (size_t slash; (slash = rest.find('/')) != std::string::npos; rest = rest.substr(slash + 1)) {
        std::string comp = rest.substr(0, slash);
        walked += "/" + comp;
        int sub = ::openat(cur.get(), comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
          auto d = make_marked_dir(cur.get(), comp, mk, walked);
          if (!d) return fail(d.error());
          sub = ::dup(d->get());
          staged_dirs.push_back(std::move(*d));
        }
        cur = Fd(sub);
      }
      sl.dir = std::move(cur);
      sl.base = rest;
      into = sl.dir.get();
      name = rest;
    }
    if (int e = fault("temp-create")) return fail(io(c.path, "cannot create a temp file beside it", e));
    int fd = ::openat(into, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return fail(io(c.path, "cannot create a temp file beside it", errno));
    if (sl.staged_by < 0) sl.made_tmp = true;  // staged files go with their staging folder
    Fd owned(fd);
    if (auto s = write_all(fd, c.new_bytes, c.path, "temp-write"); !s) return fail(s.error());
    if (c.keep_owner && ::fchown(fd, c.uid, c.gid) != 0) return fail(io(c.path, "cannot keep the file owner", errno));
    if (::fchmod(fd, c.mode & 07777) != 0) return fail(io(c.path, "cannot keep the file mode", errno));
    if (int e = fault("temp-fsync")) return fail(io(c.path, "cannot fsync the temp file", e));
    if (::fsync(fd) != 0) return fail(io(c.path, "cannot fsync the temp file", errno));
  }
  std::map<std::string, int> dirs;  // distinct folders written in, by path
  for (size_t i = 0; i < changes.size(); ++i)
    if (slots[i].staged_by < 0) dirs.emplace(dir_name(changes[i].path), slots[i].dir.get());
  for (size_t k = 0; k < staged_dirs.size(); ++k)
    if (auto s = fsync_dir(staged_dirs[k].get(), "new folder"); !s) return fail(s.error());
  for (auto& [d, fd] : dirs)
    if (auto s = fsync_dir(fd, d.empty() ? "." : d); !s) return fail(s.error());
  // 2. journal: the commit point
  {
    if (int e = fault("journal-write")) return fail(io(kJournalName, "cannot write the journal", e));
    int fd = ::openat(tree.fd(), kJournalTemp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return fail(io(kJournalName, "cannot write the journal", errno));
    Fd owned(fd);
    if (auto s = write_all(fd, journal_text(changes), kJournalName, "journal-write-partial"); !s)
      return fail(s.error());
    if (::fsync(fd) != 0) return fail(io(kJournalName, "cannot fsync the journal", errno));
  }
  if (int e = fault("journal-commit")) return fail(io(kJournalName, "cannot commit the journal", e));
  if (::renameat(tree.fd(), kJournalTemp, tree.fd(), kJournalName) != 0)
    return fail(io(kJournalName, "cannot commit the journal", errno));
  if (auto s = fsync_dir(tree.fd(), "."); !s) return s;  // committed: recovery finishes it
  // 3. renames
  const std::string kept = " (journal kept; `overlay recover` or the next apply/revert finishes it)";
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    Slot& sl = slots[i];
    if (sl.staged_by >= 0) continue;  // moved with its folder
    if (c.kind == Change::Rmdir) continue;
    if (int e = fault("rename")) return io(c.path, "cannot update" + kept, e);
    switch (c.kind) {
      case Change::Delete:
        if (::unlinkat(sl.dir.get(), sl.base.c_str(), 0) != 0 && errno != ENOENT)
          return io(c.path, "cannot remove the file" + kept, errno);
        break;
      case Change::Rmdir:
        break;  // after the saved old bytes are gone (they sit in the folder)
      case Change::Write:
        if (::renameat(sl.dir.get(), sl.tmp.c_str(), sl.dir.get(), sl.base.c_str()) != 0)
          return io(c.path, "cannot replace the file" + kept, errno);
        break;
      case Change::Create:
      case Change::Mkdir:
        if (rename_noreplace(sl.dir.get(), sl.tmp.c_str(), sl.dir.get(), sl.base.c_str()) != 0)
          return io(c.path, "cannot put the new " + std::string(c.kind == Change::Mkdir ? "folder" : "file") +
                                " in place" + kept,
                    errno);
        break;
    }
  }
  for (auto& [d, fd] : dirs)
    if (auto s = fsync_dir(fd, d.empty() ? "." : d); !s) return s;
  // 4. done
  for (auto& sl : slots)
    if (sl.made_saved) ::unlinkat(sl.dir.get(), sl.saved.c_str(), 0);
  for (size_t i = 0; i < changes.size(); ++i) {
    if (changes[i].kind != Change::Rmdir) continue;
    if (int e = fault("rmdir")) return io(changes[i].path, "cannot remove the folder" + kept, e);
    remove_if_only_marker(slots[i].dir.get(), slots[i].base);  // not empty any more: the folder stays
  }
  if (int e = fault("journal-remove")) return io(kJournalName, "cannot remove the journal", e);
  if (::unlinkat(tree.fd(), kJournalName, 0) != 0) return io(kJournalName, "cannot remove the journal", errno);
  return fsync_dir(tree.fd(), ".");
}

// ---------------------------------------------------------------------------
// Interrupted transactions

bool Pending::finishable() const {
  if (!corrupt.empty()) return false;
  for (const auto& e : entries)
    if (e.state == JournalEntry::Blocked) return false;
  return true;
}

std::vector<std::string> Pending::blockers() const {
  std::vector<std::string> out;
  if (!corrupt.empty()) out.push_back(std::string(kJournalName) + ": " + corrupt);
  for (const auto& e : entries)
    if (e.state == JournalEntry::Blocked) out.push_back(e.path + ": " + e.why);
  return out;
}

namespace {

constexpr const char* kWayOut =
    "`overlay recover --discard --root ROOT` rolls the interrupted transaction back (files it replaced get their "
    "old bytes back; files someone edited are kept as they are)";

// sha256 of a regular file, "-" when absent, "?" for anything else.
Result<std::string> sha_at(const Tree& tree, const std::string& rel) {
  auto t = tree.type(rel);
  if (!t) return t.error();
  if (*t == 0) return std::string("-");
  if (*t != S_IFREG) return std::string("?");
  auto d = tree.read(rel);
  if (!d) return d.error();
  if (!d->has_value()) return std::string("-");
  return kvtier::sha256_hex((*d)->bytes);
}

std::string short_sha(const std::string& s) { return s.size() > 16 ? s.substr(0, 16) : s; }

struct Parsed {
  std::vector<JournalEntry> entries;
  std::string corrupt;
};

Parsed parse_journal(const std::string& bytes) {
  Parsed p;
  Text t = split_lines(bytes);
  if (t.lines.size() < 2 || (t.lines[0] != "overlay-journal 1" && t.lines[0] != "overlay-journal 2")) {
    p.corrupt = "bad header";
    return p;
  }
  if (!t.trailing_newline || t.lines.back() != "end " + std::to_string(t.lines.size() - 2)) {
    p.corrupt = "bad end line (written only in part?)";
    return p;
  }
  static const std::set<std::string> kinds = {"write", "create", "delete", "mkdir", "rmdir"};
  for (size_t i = 1; i + 1 < t.lines.size(); ++i) {
    const std::string& l = t.lines[i];
    size_t a = l.find(' '), b = l.find(' ', a + 1), c = l.find(' ', b + 1);
    if (a == l.npos || b == l.npos || c == l.npos) {
      p.corrupt = "line " + std::to_string(i + 1) + " is malformed";
      return p;
    }
    JournalEntry e;
    e.kind = l.substr(0, a);
    e.new_sha = l.substr(a + 1, b - a - 1);
    e.old_sha = l.substr(b + 1, c - b - 1);
    e.path = l.substr(c + 1);
    if (!kinds.count(e.kind) || !validate_rel_path(e.path, kJournalName, "path")) {
      p.corrupt = "line " + std::to_string(i + 1) + " is malformed";
      return p;
    }
    p.entries.push_back(std::move(e));
  }
  return p;
}

// The mkdir entry whose folder holds `path`, or nullptr.
const JournalEntry* staging_of(const std::vector<JournalEntry>& entries, const std::string& path) {
  for (const auto& e : entries)
    if (e.kind == "mkdir" && is_under(path, e.path)) return &e;
  return nullptr;
}

std::string staged_path(const JournalEntry& mk, const std::string& path) {
  return temp_name_for(mk.path) + path.substr(mk.path.size());
}

// Decides, without writing, what finishing each line needs.
Status classify(const Tree& tree, std::vector<JournalEntry>& entries) {
  for (auto& e : entries) {
    auto blocked = [&](std::string why) {
      e.state = JournalEntry::Blocked;
      e.why = std::move(why);
    };
    if (e.kind == "mkdir" || e.kind == "rmdir") {
      auto t = tree.type(e.path);
      if (!t) return t.error();
      if (e.kind == "rmdir") {
        e.state = *t == 0 ? JournalEntry::Done : JournalEntry::ToDo;
        continue;
      }
      auto st = tree.type(temp_name_for(e.path));
      if (!st) return st.error();
      if (*t == S_IFDIR && *st == 0)
        e.state = JournalEntry::Done;
      else if (*t == 0 && *st == S_IFDIR)
        e.state = JournalEntry::ToDo;
      else if (*t != 0)
        blocked("a folder or file appeared here while the transaction was interrupted; the new folder is in " +
                temp_name_for(e.path));
      else
        blocked("the new folder and its staging folder " + temp_name_for(e.path) + " are both gone");
      continue;
    }
    auto cur = sha_at(tree, e.path);
    if (!cur) return cur.error();
    if (e.kind == "delete") {
      if (*cur == "-")
        e.state = JournalEntry::Done;
      else if (*cur == e.old_sha)
        e.state = JournalEntry::ToDo;
      else
        blocked("changed since the interrupted transaction began (sha256 " + short_sha(*cur) +
                "..., the transaction expected " + short_sha(e.old_sha) + "...); it is not deleted");
      continue;
    }
    // write / create
    if (*cur == e.new_sha) {
      e.state = JournalEntry::Done;
      continue;
    }
    const JournalEntry* mk = e.kind == "create" ? staging_of(entries, e.path) : nullptr;
    bool folder_in_place = false;
    if (mk) {
      auto t = tree.type(mk->path);
      if (!t) return t.error();
      folder_in_place = *t != 0;
    }
    bool before_ok = e.kind == "write" ? *cur == e.old_sha : *cur == "-" && !folder_in_place;
    if (!before_ok) {
      blocked(*cur == "-" ? "was removed since the interrupted transaction began; it is not recreated"
                          : "changed since the interrupted transaction began (sha256 " + short_sha(*cur) +
                                "..., neither the old " + short_sha(e.old_sha) + "... nor the new " +
                                short_sha(e.new_sha) + "... bytes); it is not overwritten");
      continue;
    }
    std::string where = mk ? staged_path(*mk, e.path) : temp_name_for(e.path);
    auto tmp = sha_at(tree, where);
    if (!tmp) return tmp.error();
    if (*tmp == e.new_sha)
      e.state = JournalEntry::ToDo;
    else
      blocked(*tmp == "-" ? "its temp " + where + " is missing, so the new text is gone"
                          : "its temp " + where + " is damaged (sha256 " + short_sha(*tmp) + "..., expected " +
                                short_sha(e.new_sha) + "...)");
  }
  return ok_status();
}

void add_unique(std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return;
  v.push_back(s);
}

}  // namespace

Result<Pending> inspect(const Tree& tree, const std::vector<std::string>& paths) {
  Pending p;
  auto journal = tree.read(kJournalName);
  if (!journal) return journal.error();
  std::vector<std::string> all = paths;
  std::set<std::string> todo_temps;  // temps the pending transaction still needs
  if (journal->has_value()) {
    p.journal = true;
    Parsed parsed = parse_journal((*journal)->bytes);
    p.corrupt = parsed.corrupt;
    p.entries = std::move(parsed.entries);
    if (auto s = classify(tree, p.entries); !s) return s.error();
    for (const auto& e : p.entries) {
      add_unique(all, e.path);
      if (e.state != JournalEntry::ToDo) continue;
      if (e.kind == "mkdir" || e.kind == "write" || e.kind == "create") todo_temps.insert(temp_name_for(e.path));
    }
    int left = 0;
    for (const auto& e : p.entries) left += e.state != JournalEntry::Done;
    std::string fate =
        p.finishable()
            ? "a committed transaction (" + std::to_string(p.entries.size()) + " changes, " + std::to_string(left) +
                  " still to do); the next apply, revert or `overlay recover` finishes it"
            : "a committed transaction that cannot be finished as it stands (see its problems); apply, revert and "
              "check refuse until it is resolved; " + std::string(kWayOut);
    p.leftovers.push_back(Leftover{kJournalName, "journal", fate});
  }
  auto jt = tree.type(kJournalTemp);
  if (!jt) return jt.error();
  if (*jt != 0)
    p.leftovers.push_back(Leftover{kJournalTemp, "journal temp",
                                   "a journal that was never committed; the next apply, revert or recover removes it"});
  std::set<std::string> seen;
  for (const auto& path : all) {
    std::vector<std::pair<std::string, std::string>> cands = {{temp_name_for(path), "temp"},
                                                              {saved_name_for(path), "saved old bytes"}};
    for (std::string d = dir_name(path); !d.empty(); d = dir_name(d)) cands.push_back({temp_name_for(d), "staging folder"});
    for (const auto& [c, what] : cands) {
      if (!seen.insert(c).second) continue;
      auto t = tree.type(c);
      if (!t) {
        if (t.error().kind == ErrorKind::Io) return t.error();
        continue;  // a parent that is not a folder: nothing of ours there
      }
      if (*t == 0) continue;
      std::string kind = what == "staging folder" || *t != S_IFDIR ? what : "staging folder";
      std::string fate;
      if (todo_temps.count(c))
        fate = p.finishable() ? "holds the new bytes; put in place when the transaction is finished"
                              : "holds the new bytes of the pending transaction; removed by `overlay recover --discard`";
      else if (kind == "saved old bytes" && p.journal)
        fate = "the old bytes of " + path + " (hard link), kept until the pending transaction ends; `overlay recover "
               "--discard` puts them back";
      else
        fate = p.journal ? "not needed by the pending transaction; removed when it is finished"
                         : "from a transaction that never committed or already finished; the next apply, revert or "
                           "recover removes it";
      p.leftovers.push_back(Leftover{c, kind, fate});
    }
  }
  return p;
}

namespace {

// Removes every leftover except the journal (the caller removes it last).
void remove_leftovers(const Tree& tree, const Pending& p) {
  for (const auto& l : p.leftovers) {
    if (l.what == "journal") continue;
    auto parent = tree.open_parent(l.path);
    if (!parent || !parent->has_value()) continue;
    std::string name = base_name(l.path);
    if (l.what == "staging folder")
      remove_tree((*parent)->get(), name);
    else
      ::unlinkat((*parent)->get(), name.c_str(), 0);
  }
}

Status end_journal(const Tree& tree, const char* step) {
  if (int e = fault(step)) return io(kJournalName, "cannot remove the journal", e);
  if (::unlinkat(tree.fd(), kJournalName, 0) != 0 && errno != ENOENT)
    return io(kJournalName, "cannot remove the journal", errno);
  if (::fsync(tree.fd()) != 0) return io(".", "cannot fsync directory", errno);
  return ok_status();
}

}  // namespace

Result<bool> recover(const Tree& tree, const std::vector<std::string>& paths) {
  auto pending = inspect(tree, paths);
  if (!pending) return pending.error();
  Pending& p = *pending;
  bool changed = false;
  if (p.journal) {
    if (!p.finishable()) {
      auto blockers = p.blockers();
      std::string first = blockers.front();
      size_t colon = first.find(": ");
      Error e = make_error(ErrorKind::Tampered, first.substr(0, colon),
                           "an interrupted transaction cannot be finished: " + first.substr(colon + 2) +
                               "; nothing was changed. Way out: " + kWayOut);
      e.details = blockers;
      return e;
    }
    std::map<std::string, Fd> dirs;
    for (const auto& e : p.entries) {
      if (e.state != JournalEntry::ToDo || e.kind == "rmdir") continue;
      auto parent = tree.open_parent(e.path);
      if (!parent) return parent.error();
      if (!parent->has_value()) return make_error(ErrorKind::Tampered, e.path, "its folder is gone; cannot finish");
      int dir = (*parent)->get();
      std::string base = base_name(e.path), tmp = base_name(temp_name_for(e.path));
      if (int err = fault("recover-rename"))
        return io(e.path, "cannot finish the interrupted transaction", err);
      if (e.kind == "delete") {
        if (::unlinkat(dir, base.c_str(), 0) != 0 && errno != ENOENT) return io(e.path, "cannot remove the file", errno);
      } else if (e.kind == "write") {
        if (::renameat(dir, tmp.c_str(), dir, base.c_str()) != 0) return io(e.path, "cannot replace the file", errno);
      } else if (e.kind == "create" && staging_of(p.entries, e.path)) {
        continue;  // moved with its folder by the mkdir line before it
      } else if (rename_noreplace(dir, tmp.c_str(), dir, base.c_str()) != 0) {
        return io(e.path, e.kind == "mkdir" ? "cannot put the new folder in place" : "cannot put the new file in place",
                  errno);
      }
      changed = true;
      dirs.emplace(dir_name(e.path), std::move(**parent));
    }
    for (auto& [d, fd] : dirs)
      if (::fsync(fd.get()) != 0) return io(d.empty() ? "." : d, "cannot fsync directory", errno);
    remove_leftovers(tree, p);
    for (const auto& e : p.entries) {  // folders last: the saved old bytes sat in them
      if (e.state != JournalEntry::ToDo || e.kind != "rmdir") continue;
      if (int err = fault("recover-rmdir")) return io(e.path, "cannot remove the folder", err);
      auto parent = tree.open_parent(e.path);
      if (!parent) return parent.error();
      if (parent->has_value()) remove_if_only_marker((*parent)->get(), base_name(e.path));
    }
    if (auto s = end_journal(tree, "recover-journal-remove"); !s) return s.error();
    return true;
  }
  // No journal: temps belong to a transaction that never committed.
  remove_leftovers(tree, p);
  changed = !p.leftovers.empty();
  return changed;
}

Result<DiscardReport> discard(const Tree& tree, const std::vector<std::string>& paths) {
  auto pending = inspect(tree, paths);
  if (!pending) return pending.error();
  Pending& p = *pending;
  DiscardReport r;
  r.had_journal = p.journal;
  if (p.journal && !p.corrupt.empty())
    return make_error(ErrorKind::Tampered, kJournalName,
                      "journal is corrupt (" + p.corrupt +
                          "); it cannot be rolled back either: restore the files it names by hand (reinstall the "
                          "engine wheel), then remove the journal");
  for (size_t k = p.entries.size(); k-- > 0;) {
    const JournalEntry& e = p.entries[k];
    auto parent = tree.open_parent(e.path);
    if (!parent) return parent.error();
    if (!parent->has_value()) {
      if (e.kind == "create" || e.kind == "mkdir") continue;  // inside a folder that never appeared
      r.kept.push_back(e.path + ": its folder is gone; reinstall the engine wheel to restore it");
      continue;
    }
    int dir = (*parent)->get();
    std::string base = base_name(e.path), saved = base_name(saved_name_for(e.path));
    if (int err = fault("discard")) return io(e.path, "cannot roll back", err);
    if (e.kind == "rmdir") {
      auto t = tree.type(e.path);
      if (!t) return t.error();
      if (*t != 0) continue;
      struct stat pst {};
      if (::fstat(dir, &pst) != 0) return io(e.path, "cannot stat the parent folder", errno);
      auto d = make_marked_dir(dir, base, mkdir_change(e.path, pst), e.path);
      if (!d) return d.error();
      r.restored.push_back(e.path + "/");
      continue;
    }
    if (e.kind == "mkdir") {
      auto t = tree.type(e.path);
      if (!t) return t.error();
      if (*t != S_IFDIR) continue;  // never put in place: its staging folder goes with the leftovers
      if (remove_marked_tree(dir, base))
        r.removed.push_back(e.path + "/");
      else
        r.kept.push_back(e.path + "/: the folder holds files the transaction did not create; kept");
      continue;
    }
    auto cur = sha_at(tree, e.path);
    if (!cur) return cur.error();
    auto old = sha_at(tree, saved_name_for(e.path));
    if (!old) return old.error();
    if (e.kind == "create") {
      if (*cur == e.new_sha) {
        if (::unlinkat(dir, base.c_str(), 0) != 0) return io(e.path, "cannot remove the file", errno);
        r.removed.push_back(e.path);
      } else if (*cur != "-") {
        r.kept.push_back(e.path + ": not the bytes the transaction wrote; kept");
      }
      continue;
    }
    // write / delete: the old bytes back, from the saved link
    bool want_old = e.kind == "write" ? *cur == e.new_sha : *cur == "-";
    if (*cur == e.old_sha) continue;
    if (!want_old) {
      r.kept.push_back(e.path + ": changed by someone since the transaction began; kept as it is");
      continue;
    }
    if (*old != e.old_sha) {
      r.kept.push_back(e.path + (e.kind == "write" ? ": keeps the transaction's new text" : ": stays deleted") +
                       " (its old bytes were not saved); reinstall the engine wheel to restore the pinned file");
      continue;
    }
    if (::renameat(dir, saved.c_str(), dir, base.c_str()) != 0) return io(e.path, "cannot restore the old bytes", errno);
    r.restored.push_back(e.path);
  }
  remove_leftovers(tree, p);
  if (p.journal)
    if (auto s = end_journal(tree, "discard-journal-remove"); !s) return s.error();
  if (!p.journal)
    for (const auto& l : p.leftovers) r.removed.push_back(l.path);
  return r;
}

}  // namespace patcher
