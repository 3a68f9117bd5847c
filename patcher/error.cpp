#include "error.h"

namespace patcher {

const char* kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::NotExpected: return "not-expected";
    case ErrorKind::Usage: return "usage";
    case ErrorKind::Drift: return "drift";
    case ErrorKind::Tampered: return "tampered";
    case ErrorKind::Compile: return "compile";
    case ErrorKind::Io: return "io";
    case ErrorKind::Busy: return "busy";
  }
  return "?";
}

}  // namespace patcher
