// Filling an item's status, reason and message (both item kinds share the
// fields): the reason is copied bounded and NUL-terminated.
#pragma once

#include <cstdint>
#include <string_view>

namespace storeio {

// Where one item's verdict goes: pointers into its C ABI struct's fields.
struct StatusFields {
  std::int32_t* status;
  std::int32_t* sys_errno;
  char* reason;
  std::size_t reason_size;
  char* message;
  std::size_t message_size;
};

void set_ok(const StatusFields& out);
// `path` may be null; the message is "<path>: <text>".
void set_failure(const StatusFields& out, std::int32_t status, std::string_view reason, int err,
                 const char* path, std::string_view text);

template <class Item>
StatusFields status_fields_of(Item& item) {
  return StatusFields{&item.status,       &item.sys_errno, item.reason,
                      sizeof item.reason, item.message,    sizeof item.message};
}

}  // namespace storeio
