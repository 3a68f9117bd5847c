// Typed errors and a small Result type: the library never prints and never
// throws; the CLI maps ErrorKind to an exit code.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace patcher {

// Values are the CLI exit codes (docs/OVERLAYS.md lists them).
enum class ErrorKind {
  NotExpected = 1,  // consistent tree, but not in the state `check` expected
  Usage = 2,        // usage, manifest or bad-input error
  Drift = 3,        // tree does not match the pins / anchors
  Tampered = 4,     // tampered or half-applied
  Compile = 5,      // --check-injected found a syntax error
  Io = 6,           // the OS refused a read or write
};

const char* kind_name(ErrorKind k);

struct Error {
  ErrorKind kind = ErrorKind::Usage;
  std::string file;     // the file the problem is in ("" when none)
  std::string message;  // the problem, one line, without the file name
  std::vector<std::string> details;  // extra lines (drift report, diff, ...)

  // "<file>: <message>" — the one-line form every error is printed as.
  std::string line() const { return file.empty() ? message : file + ": " + message; }
};

inline Error make_error(ErrorKind k, std::string file, std::string msg) {
  return Error{k, std::move(file), std::move(msg), {}};
}

template <class T>
class Result {
 public:
  Result(T v) : v_(std::move(v)) {}
  Result(Error e) : v_(std::move(e)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }
  Error& error() { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

struct Unit {};
using Status = Result<Unit>;
inline Status ok_status() { return Unit{}; }

}  // namespace patcher
