// kvstore's typed error and its Result<T> (kvtier::Result from
// common/result.h, named as the other libraries name theirs). Library
// functions return Result; only kvstore/main.cpp prints and picks exit codes.
#pragma once

#include <string>
#include <utility>

#include "result.h"

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

// The one result type of the repository (common/result.h) with kvstore's Error.
template <class T>
using Result = kvtier::Result<T, Error>;

// For functions with nothing to return but success.
struct Done {};

}  // namespace kvstore
