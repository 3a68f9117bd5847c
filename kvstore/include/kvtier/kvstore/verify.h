// The payload pass of `kvstore verify`: after the scan read every chunk's
// header, checksum every payload the header read did not already cover, and
// turn a mismatch into a `corrupt` finding (FORMAT.md 3.5 step 15).
#pragma once

#include <cstdint>
#include <cstddef>

#include "kvtier/kvstore/inventory.h"

namespace kvstore {

struct ScanOptions;

// A chunk's path below `rank_fd` is its rel less the first `rank_prefix`
// bytes. Adds findings to inv and marks damaged chunks; a chunk that vanished
// or was replaced since the scan is left as the scan saw it.
void verify_payloads(int rank_fd, size_t rank_prefix, RankInventory& inv, const ScanOptions& opt,
                     uint64_t* bytes_read);

// verify --key (FORMAT.md 3.6): every chunk of a keyed store must be sealed
// and its MAC hold (a `corrupt` finding with mac_missing / mac_mismatch).
// Reads each file once more, after the payload pass.
// A sealed file whose header fails (cut, bytes appended, ...) is judged by its
// MAC first, as restore judges it: mac_mismatch replaces the header's verdict.
void verify_macs(int rank_fd, size_t rank_prefix, RankInventory& inv, const ScanOptions& opt);

// verify without the key, in a keyed store: a chunk that is not sealed is
// mac_missing (the flag is seen without the key; its MAC is not checked).
void judge_seals(RankInventory& inv);

}  // namespace kvstore
