// Outcome<T>: a value or a typed error, for the kvstore library code.
// C++20 has no std::expected; this is the small subset we need. Library
// functions return Outcome; only kvstore/main.cpp prints and picks exit codes.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kvstore {

enum class ErrorKind {
  kIo,        // a system call failed (errno in `err`)
  kInvalid,   // bad argument or bad input file
  kRefused,   // an operation declined for safety (sweep refusal, lock timeout)
};

struct Error {
  ErrorKind kind = ErrorKind::kIo;
  std::string path;     // the file the error is about, relative or absolute
  std::string message;  // one line, no trailing newline
  int err = 0;          // errno where kind == kIo

  // "path: message" - the one-line form the CLI prints.
  std::string line() const { return path.empty() ? message : path + ": " + message; }
};

Error io_error(std::string path, int err, std::string what);

template <class T>
class Outcome {
 public:
  Outcome(T value) : v_(std::move(value)) {}
  Outcome(Error error) : v_(std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  T* operator->() { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// For functions with nothing to return but success.
struct Done {};

}  // namespace kvstore
