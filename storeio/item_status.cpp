#include "item_status.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace storeio {
namespace {

void copy_bounded(char* dst, std::size_t size, std::string_view text) {
  if (size == 0) return;
  const std::size_t n = std::min(size - 1, text.size());
  std::memcpy(dst, text.data(), n);
  dst[n] = '\0';
}

}  // namespace

void set_ok(const StatusFields& out) {
  *out.status = 0;
  *out.sys_errno = 0;
  copy_bounded(out.reason, out.reason_size, "");
  copy_bounded(out.message, out.message_size, "");
}

void set_failure(const StatusFields& out, std::int32_t status, std::string_view reason, int err,
                 const char* path, std::string_view text) {
  *out.status = status;
  *out.sys_errno = err;
  copy_bounded(out.reason, out.reason_size, reason);
  std::string message = path ? std::string(path) + ": " : std::string();
  message += text;
  copy_bounded(out.message, out.message_size, message);
}

}  // namespace storeio
