// Typed errors for the format v1 codec. Library calls return Result<T>
// (kvtier::Result from common/result.h with this Error); only a
// CLI turns an Error into a message and an exit code. Reason names (see
// reason_name) are shared with the Python codec and the test vectors.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "result.h"

namespace kvformat {

enum class Reason {
  Truncated,
  BadMagic,
  UnsupportedVersion,
  BadHeaderLength,
  UnsupportedChecksumAlgorithm,
  HeaderChecksumMismatch,
  ReservedNonzero,
  BadKeyHash,
  FieldOutOfRange,
  BadSegmentTable,
  TrailingBytes,
  PayloadChecksumMismatch,
  BadJson,
  BadField,
  ManifestChecksumMismatch,
  ManifestInconsistent,
  BadName,
  MacMissing,   // keyed store (FORMAT.md 3.6): a file without its MAC
  MacMismatch,  // keyed store: the MAC differs (forged, another key, or rot)
  IoError,  // C++ only: reading the file failed (Python raises OSError)
};

// snake_case name, e.g. "header_checksum_mismatch"; equals Python Reason.value.
std::string_view reason_name(Reason reason);

struct Error {
  Reason reason;
  std::string message;
};

inline Error make_error(Reason reason, std::string message) {
  return Error{reason, std::move(message)};
}

// The one result type of the repository (common/result.h) with this codec's Error.
template <class T>
using Result = kvtier::Result<T, Error>;

}  // namespace kvformat
