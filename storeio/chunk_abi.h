// What the chunk calls of ABI 5 (chunk_header.cpp, chunk_seal.cpp) share:
// a header handed back as the ABI's fields, a store file opened as FORMAT.md
// 2 says, and a keyed file's MAC verdicts in the codec's words.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "fd.h"
#include "kvtier/format/header.h"
#include "kvtier/store_abi.h"

namespace storeio {

// `h` into the ABI's fields and the first `capacity` table entries.
void fill_header(const kvformat::ChunkHeader& h, kvtier_chunk_header* header,
                 kvtier_segment* segments, std::uint32_t capacity);

// bad_argument for no header to fill, or no array with a nonzero capacity.
std::optional<std::int32_t> bad_outputs(kvtier_result* out, const kvtier_chunk_header* header,
                                        const kvtier_segment* segments, std::uint32_t capacity);

// The regular file at `path` opened read-only, no symlink as the file or a
// folder on its path, never a FIFO's open that blocks; else `out` filled
// (missing_file, io_error with ELOOP or EINVAL) and its status returned.
std::variant<kvtier::Fd, std::int32_t> open_store_file(const char* path, kvtier_result* out,
                                                       std::uint64_t* size);

#if KVTIER_STORE_HAVE_MAC
// A keyed file's plain chunk, its MAC checked first (FORMAT.md 3.6), or `out`
// filled with the verdict (mac_missing, truncated, mac_mismatch,
// bad_header_length) and its status returned. `path` names the file, if any.
std::variant<std::vector<std::uint8_t>, std::int32_t> open_sealed(
    std::span<const std::uint8_t> file, std::span<const std::uint8_t> key, std::uint32_t rank,
    kvtier_result* out, const char* path);
#endif

}  // namespace storeio
