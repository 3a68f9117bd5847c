// One write transaction across files. Crash-safe order:
//   0. preflight: every folder writable, no target immutable, free space and
//      inodes for every temp; nothing is written when it fails
//   1. each new text goes to ".<name>.overlay-tmp" beside its target (O_EXCL,
//      mode and owner copied, fsync); a file being replaced or deleted is
//      hard-linked to ".<name>.overlay-old" (its old bytes, for `recover
//      --discard`); a new folder is built whole under ".<name>.overlay-tmp"
//      in its parent, with its files and a marker; directories fsynced
//   2. the journal ".overlay-journal" in the tree root is written to a temp,
//      fsynced and renamed into place: this is the commit point
//   3. staged folders and temps are renamed into place, deletions unlinked,
//      emptied overlay folders removed; directories fsynced
//   4. the saved old bytes and then the journal are removed; the root fsynced
// A run that finds a journal verifies all of it, then rolls it forward
// (recover) or, on request, back (discard); a run that finds temps but no
// journal removes them: that transaction never committed.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "error.h"
#include "paths.h"

namespace patcher {

inline constexpr const char* kJournalName = ".overlay-journal";
inline constexpr const char* kJournalTemp = ".overlay-journal.tmp";
// Marks a folder the engine created; revert removes the folder once only the
// marker is left in it.
inline constexpr const char* kDirMarker = ".overlay-dir";
// Beside the marker, a record another tool wrote of the files it installed
// in such a folder (docker/bake.sh: the store library beside native.py), one
// `<sha256>  <name>` line each (installed.cpp).
inline constexpr const char* kInstalledRecord = ".overlay-installed";
// The names in the open folder `dir` that its record lists and whose bytes
// still match, then the record itself: what a revert removes with the
// folder. Empty without a record, or when a line of it does not parse.
std::vector<std::string> installed_files(int dir);

std::string temp_name_for(const std::string& rel);   // ".<name>.overlay-tmp" beside rel
std::string saved_name_for(const std::string& rel);  // ".<name>.overlay-old" beside rel

struct Change {
  enum Kind { Write, Create, Delete, Mkdir, Rmdir };
  Kind kind = Write;
  std::string path;
  std::string old_sha;    // Write, Delete
  std::string new_bytes;  // Write, Create
  mode_t mode = 0644;
  bool keep_owner = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

const char* change_kind_name(Change::Kind k);  // "write", "create", ... as in the journal

// The one place a Change is built.
Change write_change(const std::string& path, const FileData& old, std::string new_bytes);
Change create_change(const std::string& path, std::string bytes);
Change delete_change(const std::string& path, const std::string& old_sha);
// A missing folder (the topmost missing one); mode and owner follow `parent`.
Change mkdir_change(const std::string& dir, const struct stat& parent);
// A folder the engine created, removed when only its marker is left.
Change rmdir_change(const std::string& dir);

// Writes `changes` in one transaction. Changes are carried out in the given
// order: a Mkdir must come before the creates inside it, a Rmdir after the
// deletions that empty it.
Status commit(const Tree& tree, const std::vector<Change>& changes);

// One line of a pending journal and what finishing it needs.
struct JournalEntry {
  std::string kind;  // write | create | delete | mkdir | rmdir
  std::string path, new_sha, old_sha;
  enum State { Done, ToDo, Blocked } state = Done;
  std::string why;  // Blocked: the problem, one line
};

// Anything an interrupted or failed transaction left in the tree.
struct Leftover {
  std::string path;
  std::string what;  // journal | journal temp | temp | saved old bytes | staging folder
  std::string fate;  // what the next apply/revert (or recover) does with it
};

struct Pending {
  bool journal = false;  // a committed transaction waits to be finished
  std::string corrupt;   // non-empty: the journal cannot be read (why)
  std::vector<JournalEntry> entries;
  std::vector<Leftover> leftovers;
  // "path: why" of each file the transaction replaced or deleted that holds
  // its new bytes but whose saved old bytes are gone or damaged: while there
  // is one, the transaction cannot be rolled back whole, so discard refuses.
  std::vector<std::string> unsaved;
  // "path: why" of each file the transaction had already given its new
  // bytes (renamed into place, or created) and that someone edited since:
  // rolling back would drop that edit, keeping it would leave the tree
  // half-applied (issue 45), so discard refuses while there is one.
  std::vector<std::string> edited;
  bool finishable() const;
  std::vector<std::string> blockers() const;  // "path: why" of each Blocked entry
};

// Read-only look at the journal and the leftovers beside `paths` (the
// manifests' files; the journal's own paths are added).
Result<Pending> inspect(const Tree& tree, const std::vector<std::string>& paths);

// Finishes a pending transaction after verifying every line of it (nothing is
// renamed unless every line can be finished), then removes leftovers of
// transactions that never committed. True when it changed anything.
Result<bool> recover(const Tree& tree, const std::vector<std::string>& paths);

// The way out when a pending transaction cannot be finished: rolls it back.
// A file the transaction replaced or deleted gets its saved old bytes back; a
// file it created is removed; a file that holds neither the old nor the new
// bytes (someone edited it) is left alone and listed in `kept`.
struct DiscardReport {
  bool had_journal = false;
  std::vector<std::string> restored, removed, kept;
};
Result<DiscardReport> discard(const Tree& tree, const std::vector<std::string>& paths);

}  // namespace patcher
