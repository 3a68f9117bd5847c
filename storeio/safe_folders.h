// Whether others could change what is in a store folder (FORMAT.md 2;
// issue 45: a chunk folder with mode 0777 let another user swap files).
// The same verdict as the overlays' store_perms.folder_problem for a folder
// inside a store.
#pragma once

#include <optional>
#include <string>

namespace storeio {

// One line naming `folder`, its mode and owner when it is a symlink, not a
// folder, owned by a user other than root or the caller, or writable by its
// group or the world; "cannot check" with the error when lstat fails other
// than ENOENT; nullopt when it is safe or does not exist.
std::optional<std::string> folder_problem(const std::string& folder);

// The first problem of the two folders above a chunk file
// (<hhh>/<hh>_g<g>/<hash>.bin), nearest first.
std::optional<std::string> chunk_folders_problem(const char* chunk_path);

}  // namespace storeio
