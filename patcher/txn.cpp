// The transaction's forward path: change builders, the file-system steps, preflight and commit.
// Reading an interrupted transaction back (inspect, recover, discard) is in recovery.cpp.
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
#include "txn_steps.h"

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

namespace txn_steps {

static constexpr const char* kMarkerText = "# folder created by overlay; overlay revert removes it once it holds nothing else\n";

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
// marker and what its installed record lists with matching bytes (those
// first, the record last of them). True when it is gone.
bool remove_if_only_marker(int parent, const std::string& name) {
  int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  Fd owned(fd);
  auto names = list_dir(fd, name);
  if (!names) return false;
  std::vector<std::string> ours = installed_files(fd);
  for (const auto& n : *names)
    if (n != kDirMarker && std::find(ours.begin(), ours.end(), n) == ours.end()) return false;
  for (const auto& n : ours) ::unlinkat(fd, n.c_str(), 0);
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

// sha256 of `name` in `dir` as it is now, "-" when absent, "?" when it is not
// a regular file. No fault step: the re-checks below must not move the
// numbering of the steps the crash tests kill at.
Result<std::string> sha_now(int dir, const std::string& name, const std::string& display, std::string* bytes) {
  int fd = ::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::string("-");
    if (errno == ELOOP) return std::string("?");
    return io(display, "cannot read it again before replacing it", errno);
  }
  Fd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io(display, "cannot stat it", errno);
  if (!S_ISREG(st.st_mode)) return std::string("?");
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return io(display, "cannot read it again before replacing it", errno);
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  std::string sha = kvtier::sha256_hex(data);
  if (bytes) *bytes = std::move(data);
  return sha;
}

}  // namespace txn_steps

namespace {

using namespace txn_steps;

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

// Another process may edit a target while this one writes (the lock keeps
// only other `overlay` runs out): each target must still hold the bytes the
// plan was made from (a file to create: still be absent) right before the
// journal commits and again right before its own rename. Busy (exit 7): the
// tree is being changed under us; the next run sees the edit and judges it.
Status still_as_read(const Change& c, const Slot& sl) {
  if (c.kind == Change::Rmdir || sl.staged_by >= 0) return ok_status();
  auto cur = sha_now(sl.dir.get(), sl.base, c.path);
  if (!cur) return cur.error();
  bool replaces = c.kind == Change::Write || c.kind == Change::Delete;
  if (replaces ? *cur == c.old_sha : *cur == "-") return ok_status();
  std::string what = !replaces                 ? "it was absent, now something is there"
                     : *cur == "-"             ? "it was removed"
                     : *cur == "?"             ? "it is no longer a regular file"
                                               : "read as sha256 " + c.old_sha.substr(0, 16) + "..., now " +
                                       cur->substr(0, 16) + "...";
  return make_error(ErrorKind::Busy, c.path, "changed by another process while overlay was writing (" + what + ")");
}

// Keeps the old bytes of a file being replaced or deleted, for `recover
// --discard`: a hard link, or a copy where the file system has no hard links.
// Any other failure fails the transaction before its commit point: without
// them the transaction could not be rolled back.
Status save_old(const Change& c, Slot& sl) {
  int e = fault("link-old");
  if (e == 0 && ::linkat(sl.dir.get(), sl.base.c_str(), sl.dir.get(), sl.saved.c_str(), 0) == 0) {
    sl.made_saved = true;
    return ok_status();
  }
  if (e == 0) e = errno;
  std::string saved = saved_name_for(c.path);
  if (e != EPERM && e != EOPNOTSUPP && e != EMLINK)
    return io(c.path, "cannot save its old bytes as " + saved + " (nothing was written)", e);
  std::string bytes;
  auto sha = sha_now(sl.dir.get(), sl.base, c.path, &bytes);
  if (!sha) return sha.error();
  if (*sha != c.old_sha) return still_as_read(c, sl);
  struct stat st {};
  if (::fstatat(sl.dir.get(), sl.base.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return io(c.path, "cannot stat it", errno);
  int fd = ::openat(sl.dir.get(), sl.saved.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return io(c.path, "cannot save its old bytes as " + saved + " (nothing was written)", errno);
  sl.made_saved = true;
  Fd owned(fd);
  if (auto s = write_all(fd, bytes, saved, "saved-copy"); !s) return s;
  (void)::fchown(fd, st.st_uid, st.st_gid);  // best effort, as a restore by hand would be
  if (::fchmod(fd, st.st_mode & 07777) != 0 || ::fsync(fd) != 0)
    return io(c.path, "cannot save its old bytes as " + saved + " (nothing was written)", errno);
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
      ::unlinkat(sl.dir.get(), sl.saved.c_str(), 0);
      if (auto s = save_old(c, sl); !s) return fail(s.error());
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
  for (size_t i = 0; i < changes.size(); ++i)
    if (auto s = still_as_read(changes[i], slots[i]); !s) {
      Error e = s.error();
      e.message += "; nothing was written, try again";
      return fail(e);
    }
  if (::renameat(tree.fd(), kJournalTemp, tree.fd(), kJournalName) != 0)
    return fail(io(kJournalName, "cannot commit the journal", errno));
  if (auto s = fsync_dir(tree.fd(), "."); !s) return s;  // committed: recovery finishes it
  // 3. renames
  const std::string kept = " (journal kept; `overlay recover` or the next apply/revert finishes it)";
  // A target changed under us after the commit point: the changes already in
  // place are rolled back from the saved old bytes (all of them are still
  // there), the changed file is kept as it is, the journal removed.
  // Every file edited meanwhile is named, not only the one that stopped it
  // (issue 45). A file already given its new bytes and edited since makes
  // the rollback refuse whole (discard): nothing is rolled back, no new
  // module removed under a file that imports it, the journal kept.
  auto roll_back = [&](Error e) -> Status {
    auto d = discard(tree, {});
    if (!d) {
      if (d.error().kind != ErrorKind::Tampered) {
        e.message += "; rolling the transaction back failed too (" + d.error().line() +
                     "): the journal is kept, `overlay recover --discard` rolls it back";
        return e;
      }
      Error r = d.error();
      r.message = e.message + "; and the transaction was not rolled back: " + d.error().line();
      r.file = e.file;
      r.details.insert(r.details.begin(), e.line());
      return r;
    }
    std::string kept;
    for (const auto& k : d->kept) {
      e.details.push_back(k);
      kept += (kept.empty() ? "" : ", ") + k.substr(0, k.find(": "));
    }
    e.message += "; the transaction was rolled back, " + (kept.empty() ? std::string("that file") : kept) +
                 " kept as " + (d->kept.size() > 1 ? "they are" : "it is") + "; try again";
    return e;
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    Slot& sl = slots[i];
    if (sl.staged_by >= 0) continue;  // moved with its folder
    if (c.kind == Change::Rmdir) continue;
    if (int e = fault("rename")) return io(c.path, "cannot update" + kept, e);
    if (auto s = still_as_read(c, sl); !s) return roll_back(s.error());
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
  for (auto& sl : slots) {
    if (!sl.made_saved) continue;
    if (int e = fault("unlink-saved")) return io(kJournalName, "cannot remove the saved old bytes" + kept, e);
    ::unlinkat(sl.dir.get(), sl.saved.c_str(), 0);
  }
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

}  // namespace patcher
