#include "kvtier/format/format_error.h"

namespace kvformat {

std::string_view reason_name(Reason reason) {
  switch (reason) {
    case Reason::Truncated: return "truncated";
    case Reason::BadMagic: return "bad_magic";
    case Reason::UnsupportedVersion: return "unsupported_version";
    case Reason::BadHeaderLength: return "bad_header_length";
    case Reason::UnsupportedChecksumAlgorithm: return "unsupported_checksum_algorithm";
    case Reason::HeaderChecksumMismatch: return "header_checksum_mismatch";
    case Reason::ReservedNonzero: return "reserved_nonzero";
    case Reason::BadKeyHash: return "bad_key_hash";
    case Reason::FieldOutOfRange: return "field_out_of_range";
    case Reason::BadSegmentTable: return "bad_segment_table";
    case Reason::TrailingBytes: return "trailing_bytes";
    case Reason::PayloadChecksumMismatch: return "payload_checksum_mismatch";
    case Reason::BadJson: return "bad_json";
    case Reason::BadField: return "bad_field";
    case Reason::ManifestChecksumMismatch: return "manifest_checksum_mismatch";
    case Reason::ManifestInconsistent: return "manifest_inconsistent";
    case Reason::BadName: return "bad_name";
    case Reason::MacMissing: return "mac_missing";
    case Reason::MacMismatch: return "mac_mismatch";
    case Reason::IoError: return "io_error";
  }
  return "unknown";
}

}  // namespace kvformat
