// Typed errors for the format v1 codec. Library calls return Result<T>; only a
// CLI turns an Error into a message and an exit code. Reason names (see
// reason_name) are shared with the Python codec and the test vectors.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

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

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{Reason::IoError, {}};
  bool ok_ = true;
};

}  // namespace kvformat
