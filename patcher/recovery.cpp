// Reading an interrupted transaction back: inspect (what the journal says and what the tree holds),
// recover (finish it forward) and discard (roll it back). The forward path is in txn.cpp.
#include "txn.h"
#include "txn_steps.h"

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

using namespace txn_steps;

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
    "old bytes back; a file edited before the transaction gave it its new bytes is kept as it is)";
// A journal that cannot be read cannot be rolled back either.
constexpr const char* kCorruptWayOut =
    "the journal cannot be read, so the transaction can be neither finished nor rolled back: restore the files it "
    "touched by hand (reinstall the engine wheel), then remove the journal";

// Why the transaction cannot be rolled back whole ("" when it can).
std::string no_rollback(const Pending& p) {
  if (!p.unsaved.empty()) return p.unsaved.front();
  if (!p.edited.empty()) return p.edited.front();
  return "";
}

// Neither finishable (the caller knows) nor discardable: the one way left.
std::string stuck_way_out(const Pending& p) {
  std::string blocker = p.blockers().empty() ? "" : p.blockers().front();
  return "it cannot be rolled back whole either (" + no_rollback(p) + "): give " +
         blocker.substr(0, blocker.find(": ")) +
         " the bytes the transaction wrote (undo the edit) and run `overlay recover --root ROOT`, or reinstall the "
         "engine wheel";
}

std::string way_out(const Pending& p) {
  if (!p.corrupt.empty()) return kCorruptWayOut;
  return no_rollback(p).empty() ? kWayOut : stuck_way_out(p);
}

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

// Pending::unsaved: a file that needs its old bytes back (it holds the new
// ones; a file someone edited is kept, not rolled back) and has no intact
// saved copy of them.
Result<std::vector<std::string>> find_unsaved(const Tree& tree, const std::vector<JournalEntry>& entries) {
  std::vector<std::string> unsaved;
  for (const auto& e : entries) {
    if (e.kind != "write" && e.kind != "delete") continue;
    auto cur = sha_at(tree, e.path);
    if (!cur) return cur.error();
    bool is_new = e.kind == "write" ? *cur == e.new_sha : *cur == "-";
    if (*cur == e.old_sha || !is_new) continue;
    std::string saved = saved_name_for(e.path);
    auto old = sha_at(tree, saved);
    if (!old) return old.error();
    if (*old == "-")
      unsaved.push_back(e.path + ": its saved old bytes " + saved + " are gone");
    else if (*old != e.old_sha)
      unsaved.push_back(e.path + ": its saved old bytes " + saved + " are damaged (sha256 " + short_sha(*old) +
                        "..., expected " + short_sha(e.old_sha) + "...)");
  }
  return unsaved;
}

// Whether `a` and `b` name the same file (a hard link of it).
Result<bool> same_file(const Tree& tree, const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  for (auto [rel, st] : {std::pair{&a, &sa}, std::pair{&b, &sb}}) {
    auto parent = tree.open_parent(*rel);
    if (!parent) return parent.error();
    if (!parent->has_value()) return false;
    if (::fstatat((*parent)->get(), base_name(*rel).c_str(), st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return false;
      return io(*rel, "cannot stat it", errno);
    }
  }
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Pending::edited: a file that holds neither the old nor the new bytes and
// that the transaction had put in place before someone edited it. A file
// the transaction replaces is still its old file (the edit is to the old
// bytes, which rolling back keeps) while its temp waits to be renamed, or
// while it is the very file its saved old bytes link to; a file it creates
// is someone else's while its temp (or its staging folder) still waits.
Result<std::vector<std::string>> find_edited(const Tree& tree, const std::vector<JournalEntry>& entries) {
  std::vector<std::string> edited;
  for (const auto& e : entries) {
    if (e.kind != "write" && e.kind != "create") continue;
    auto cur = sha_at(tree, e.path);
    if (!cur) return cur.error();
    if (*cur == e.new_sha || *cur == "-" || (e.kind == "write" && *cur == e.old_sha)) continue;
    const JournalEntry* mk = e.kind == "create" ? staging_of(entries, e.path) : nullptr;
    bool ours = false;
    if (mk) {  // inside a new folder: ours once the folder is in place
      auto staging = tree.type(temp_name_for(mk->path));
      if (!staging) return staging.error();
      ours = *staging == 0;
    } else {
      auto tmp = tree.type(temp_name_for(e.path));
      if (!tmp) return tmp.error();
      ours = *tmp == 0;
      if (ours && e.kind == "write") {
        auto old_file = same_file(tree, e.path, saved_name_for(e.path));
        if (!old_file) return old_file.error();
        ours = !*old_file;
      }
    }
    if (ours)
      edited.push_back(e.path + ": edited after the interrupted transaction " +
                       (e.kind == "write" ? "gave it its new bytes" : "created it") + " (sha256 " +
                       short_sha(*cur) + "..., the transaction wrote " + short_sha(e.new_sha) +
                       "...): rolling back would drop that edit, keeping it would leave the tree half-applied");
  }
  return edited;
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
    auto unsaved = find_unsaved(tree, p.entries);
    if (!unsaved) return unsaved.error();
    p.unsaved = std::move(*unsaved);
    auto edited = find_edited(tree, p.entries);
    if (!edited) return edited.error();
    p.edited = std::move(*edited);
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
              "check refuse until it is resolved; " + way_out(p);
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
                               "; nothing was changed. Way out: " + way_out(p));
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
      if (!(e.kind == "create" && staging_of(p.entries, e.path))) {
        // As in commit(): the bytes classify() saw must still be there right
        // before the rename; another process may have changed them since.
        auto now = sha_now(dir, base, e.path);
        if (!now) return now.error();
        bool as_seen = e.kind == "write" || e.kind == "delete" ? *now == e.old_sha : *now == "-";
        if (!as_seen)
          return make_error(ErrorKind::Busy, e.path,
                            "changed by another process while the interrupted transaction was being finished; "
                            "it is not replaced and the journal is kept: run the command again");
      }
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
  // All or nothing. A file the transaction replaced or deleted can be rolled
  // back only from its saved old bytes; where they are gone (the transaction
  // was removing them, every change in place) or damaged, rolling back the
  // rest would leave the tree half-applied: new modules removed, importers
  // still patched. So one such file refuses the whole discard, whether or not
  // the transaction can be finished instead (issue 37: with a hand-edited
  // file it could not, and discard went ahead partially).
  // Issue 45: the same holds for a file the transaction had given its new
  // bytes and someone edited since: kept, it would import what the rollback
  // deletes; rolled back, the edit would be lost. Refused, nothing changed.
  std::vector<std::string> unsaved = p.unsaved;
  unsaved.insert(unsaved.end(), p.edited.begin(), p.edited.end());
  bool all_in_place = true;  // every line already Done: the transaction was cleaning up
  for (const auto& e : p.entries)
    if (e.state != JournalEntry::Done) all_in_place = false;
  if (!unsaved.empty()) {
    std::string where = all_in_place ? "the interrupted transaction had put every change in place and was cleaning up: "
                                     : "";
    std::string way;
    if (p.unsaved.empty()) {  // only edits stand in the way: undone, the rollback is whole again
      std::string names;
      for (const auto& x : p.edited) names += (names.empty() ? "" : ", ") + x.substr(0, x.find(": "));
      way = "Give " + names +
            " the bytes the transaction wrote (undo the edit), then run `overlay recover --discard --root ROOT` "
            "again (the saved old bytes are kept for it), or reinstall the engine wheel";
    } else if (p.finishable()) {
      way = "`overlay recover --root ROOT` finishes it (then `overlay revert` undoes it, if that is what you want)";
    } else {
      way = "It cannot be finished either (" + p.blockers().front() + "): give " +
            p.blockers().front().substr(0, p.blockers().front().find(": ")) +
            " the bytes the transaction wrote (undo the edit) and run `overlay recover --root ROOT`, or reinstall "
            "the engine wheel";
    }
    Error e = make_error(ErrorKind::Tampered, unsaved.front().substr(0, unsaved.front().find(": ")),
                         where + std::to_string(unsaved.size()) +
                             " file(s) cannot be rolled back, so rolling back would leave the tree half-applied; "
                             "nothing was changed. " + way);
    e.details = unsaved;
    for (const auto& b : p.blockers()) e.details.push_back(b + " (blocks finishing it)");
    return e;
  }
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
    if (*old != e.old_sha)  // refused above, before anything was rolled back: changed meanwhile
      return make_error(ErrorKind::Tampered, e.path,
                        "its saved old bytes changed while the transaction was being rolled back; stopped (the "
                        "journal is kept)");
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
