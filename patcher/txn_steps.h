// The file-system steps the transaction is made of, shared by its forward path
// (txn.cpp) and its recovery (recovery.cpp). Internal to the patcher library.
#pragma once

#include <string>

#include "txn.h"

namespace patcher::txn_steps {

Error io(const std::string& file, const std::string& what, int err);
bool is_under(const std::string& path, const std::string& dir);
Status write_all(int fd, const std::string& data, const std::string& display, const char* step);
Status fsync_dir(int fd, const std::string& display);
// renameat2(RENAME_NOREPLACE): never replaces a file someone put there meanwhile.
int rename_noreplace(int dir_from, const char* from, int dir_to, const char* to);
void remove_tree(int dirfd, const std::string& name);
// Folders the overlay created carry a marker file; these remove only such folders.
bool remove_if_only_marker(int parent, const std::string& name);
bool remove_marked_tree(int parent, const std::string& name);
// sha256 of `name` in `dir` now: "-" when absent, "?" when not a regular file;
// the bytes into `bytes` when given. Marks no fault step (see txn.cpp).
Result<std::string> sha_now(int dir, const std::string& name, const std::string& display,
                            std::string* bytes = nullptr);
Result<Fd> make_marked_dir(int parent, const std::string& name, const Change& spec, const std::string& display);

}  // namespace patcher::txn_steps
