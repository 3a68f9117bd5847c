#include "txn.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <set>

#include "fault.h"
#include "sha256.h"
#include "state.h"
#include "text.h"

namespace patcher {
namespace {

constexpr const char* kJournalTemp = ".overlay-journal.tmp";

Error io(const std::string& file, const std::string& what, int err) {
  return make_error(ErrorKind::Io, file, what + ": " + errno_text(err));
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

struct Opened {
  Fd dir;
  std::string base, tmp;
};

Result<Opened> open_for(const Tree& tree, const std::string& path) {
  auto parent = tree.open_parent(path);
  if (!parent) return parent.error();
  if (!parent->has_value()) return make_error(ErrorKind::Drift, path, "parent directory does not exist");
  Opened o;
  o.dir = std::move(**parent);
  o.base = base_name(path);
  o.tmp = base_name(temp_name_for(path));
  return o;
}

std::string journal_text(const std::vector<Change>& changes) {
  std::string j = "overlay-journal 1\n";
  for (const auto& c : changes) {
    std::string new_sha = c.kind == Change::Delete ? "-" : kvtier::sha256_hex(c.new_bytes);
    std::string old_sha = c.kind == Change::Create ? "-" : c.old_sha;
    const char* kind = c.kind == Change::Write ? "write" : c.kind == Change::Create ? "create" : "delete";
    j += std::string(kind) + " " + new_sha + " " + old_sha + " " + c.path + "\n";
  }
  j += "end " + std::to_string(changes.size()) + "\n";
  return j;
}

}  // namespace

Status commit(const Tree& tree, const std::vector<Change>& changes) {
  if (changes.empty()) return ok_status();
  std::vector<Opened> opened;
  std::vector<bool> made(changes.size(), false);
  auto cleanup = [&]() {
    for (size_t i = 0; i < opened.size(); ++i)
      if (made[i]) ::unlinkat(opened[i].dir.get(), opened[i].tmp.c_str(), 0);
    ::unlinkat(tree.fd(), kJournalTemp, 0);
  };
  auto fail = [&](Error e) -> Status {
    cleanup();
    return e;
  };
  // 1. temps
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    auto o = open_for(tree, c.path);
    if (!o) return fail(o.error());
    opened.push_back(std::move(*o));
    if (c.kind == Change::Delete) continue;
    Opened& op = opened.back();
    int fd = -1;
    if (int e = fault("temp-create")) return fail(io(c.path, "cannot create a temp file beside it", e));
    fd = ::openat(op.dir.get(), op.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return fail(io(c.path, "cannot create a temp file beside it", errno));
    made[i] = true;
    Fd owned(fd);
    if (auto s = write_all(fd, c.new_bytes, c.path, "temp-write"); !s) return fail(s.error());
    if (c.keep_owner && ::fchown(fd, c.uid, c.gid) != 0) return fail(io(c.path, "cannot keep the file owner", errno));
    if (::fchmod(fd, c.mode & 07777) != 0) return fail(io(c.path, "cannot keep the file mode", errno));
    if (int e = fault("temp-fsync")) return fail(io(c.path, "cannot fsync the temp file", e));
    if (::fsync(fd) != 0) return fail(io(c.path, "cannot fsync the temp file", errno));
  }
  std::map<std::string, int> dirs;  // distinct parents, by path
  for (size_t i = 0; i < changes.size(); ++i) dirs.emplace(dir_name(changes[i].path), opened[i].dir.get());
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
  for (size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    Opened& op = opened[i];
    if (int e = fault("rename")) return io(c.path, "cannot replace the file (journal kept; rerun to finish)", e);
    if (c.kind == Change::Delete) {
      if (::unlinkat(op.dir.get(), op.base.c_str(), 0) != 0 && errno != ENOENT)
        return io(c.path, "cannot remove the file (journal kept; rerun to finish)", errno);
    } else if (::renameat(op.dir.get(), op.tmp.c_str(), op.dir.get(), op.base.c_str()) != 0) {
      return io(c.path, "cannot replace the file (journal kept; rerun to finish)", errno);
    }
  }
  for (auto& [d, fd] : dirs)
    if (auto s = fsync_dir(fd, d.empty() ? "." : d); !s) return s;
  // 4. done
  if (int e = fault("journal-remove")) return io(kJournalName, "cannot remove the journal", e);
  if (::unlinkat(tree.fd(), kJournalName, 0) != 0) return io(kJournalName, "cannot remove the journal", errno);
  return fsync_dir(tree.fd(), ".");
}

Result<bool> recover(const Tree& tree, const std::vector<std::string>& paths) {
  bool changed = false;
  auto journal = tree.read(kJournalName);
  if (!journal) return journal.error();
  if (journal->has_value()) {
    Text t = split_lines((*journal)->bytes);
    auto corrupt = [&](const std::string& why) {
      return make_error(ErrorKind::Tampered, kJournalName, "journal is corrupt (" + why + "); inspect it by hand");
    };
    if (t.lines.size() < 2 || t.lines[0] != "overlay-journal 1") return corrupt("bad header");
    if (t.lines.back() != "end " + std::to_string(t.lines.size() - 2)) return corrupt("bad end line");
    std::map<std::string, int> dirs;
    std::vector<Fd> keep;
    for (size_t i = 1; i + 1 < t.lines.size(); ++i) {
      const std::string& l = t.lines[i];
      size_t a = l.find(' '), b = l.find(' ', a + 1), c = l.find(' ', b + 1);
      if (a == l.npos || b == l.npos || c == l.npos) return corrupt("line " + std::to_string(i + 1));
      std::string kind = l.substr(0, a), new_sha = l.substr(a + 1, b - a - 1), old_sha = l.substr(b + 1, c - b - 1),
                  path = l.substr(c + 1);
      if (auto s = validate_rel_path(path, kJournalName, "path"); !s) return s.error();
      auto o = open_for(tree, path);
      if (!o) return o.error();
      auto cur = tree.read(path);
      if (!cur) return cur.error();
      std::string cur_sha = cur->has_value() ? kvtier::sha256_hex((*cur)->bytes) : "-";
      if (kind == "delete") {
        if (cur_sha == "-") continue;
        if (cur_sha != old_sha)
          return make_error(ErrorKind::Tampered, path, "changed during an interrupted transaction; cannot finish it");
        if (int e = fault("recover-rename")) return io(path, "cannot remove the file", e);
        if (::unlinkat(o->dir.get(), o->base.c_str(), 0) != 0) return io(path, "cannot remove the file", errno);
      } else if (kind == "write" || kind == "create") {
        auto tmp = tree.read(temp_name_for(path));
        if (!tmp) return tmp.error();
        if (cur_sha == new_sha) {
          if (tmp->has_value()) ::unlinkat(o->dir.get(), o->tmp.c_str(), 0);
          continue;
        }
        if (!tmp->has_value() || kvtier::sha256_hex((*tmp)->bytes) != new_sha)
          return make_error(ErrorKind::Tampered, path,
                            "an interrupted transaction cannot be finished: neither the file nor its temp holds the "
                            "new text");
        if (int e = fault("recover-rename")) return io(path, "cannot replace the file", e);
        if (::renameat(o->dir.get(), o->tmp.c_str(), o->dir.get(), o->base.c_str()) != 0)
          return io(path, "cannot replace the file", errno);
      } else {
        return corrupt("line " + std::to_string(i + 1));
      }
      changed = true;
      dirs.emplace(dir_name(path), o->dir.get());
      keep.push_back(std::move(o->dir));
    }
    for (auto& [d, fd] : dirs)
      if (::fsync(fd) != 0) return io(d.empty() ? "." : d, "cannot fsync directory", errno);
    if (int e = fault("recover-journal-remove")) return io(kJournalName, "cannot remove the journal", e);
    if (::unlinkat(tree.fd(), kJournalName, 0) != 0) return io(kJournalName, "cannot remove the journal", errno);
    if (::fsync(tree.fd()) != 0) return io(".", "cannot fsync directory", errno);
    changed = true;
  }
  // No journal: temps belong to a transaction that never committed.
  for (const auto& p : paths) {
    auto parent = tree.open_parent(p);
    if (!parent || !parent->has_value()) continue;
    std::string tmp = base_name(temp_name_for(p));
    if (::unlinkat((*parent)->get(), tmp.c_str(), 0) == 0) changed = true;
  }
  if (::unlinkat(tree.fd(), kJournalTemp, 0) == 0) changed = true;
  return changed;
}

}  // namespace patcher
