// Whether others could change the store (docs/DEPLOY.md, "Security"): the
// check the writer makes at boot (kv_store_local/store_perms.py), for
// `kvstore verify` (a finding) and `gc --sweep` (a refusal).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <sys/types.h>

namespace kvstore {

// The first folder, from ROOT up to /, that someone other than root and the
// serving user could change, as one line naming it and its mode; nullopt
// when none. Like ssh's StrictModes: no symlink, owned by root or the
// serving user, not group/world-writable (above ROOT a root-owned sticky
// folder such as /tmp is fine). The serving user is `serving_uid`.
std::optional<std::string> unsafe_store_folder(const std::string& root, uid_t serving_uid);

// Why a folder below ROOT (a rank base, manifests/, pending/, a chunk
// folder) could be changed by others, as one line naming it; nullopt when it
// cannot: owned by root or the serving user and neither group- nor
// world-writable (no sticky exception below ROOT). `shown` names it.
std::optional<std::string> unsafe_inner_folder(const std::string& shown, uint32_t mode, uid_t uid,
                                               uid_t serving_uid);

// The serving user for a kvstore run: the caller, or ROOT's owner when the
// caller is root (an operator checking the serving user's store).
uid_t serving_uid_for(const std::string& root);

}  // namespace kvstore
