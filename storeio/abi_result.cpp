#include "abi_result.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "item_status.h"

namespace storeio {

std::int32_t result_ok(kvtier_result* out, std::string_view data) {
  auto* copy = static_cast<std::uint8_t*>(std::malloc(data.size() + 1));
  if (!copy) return result_failure(out, KVTIER_E_IO, "io_error", ENOMEM, nullptr, "out of memory");
  if (!data.empty()) std::memcpy(copy, data.data(), data.size());
  copy[data.size()] = 0;
  out->data = copy;
  out->length = data.size();
  set_ok(status_fields_of(*out));
  return KVTIER_OK;
}

std::int32_t result_failure(kvtier_result* out, std::int32_t status, std::string_view reason,
                            int err, const char* path, std::string_view text) {
  set_failure(status_fields_of(*out), status, reason, err, path, text);
  return status;
}

std::int32_t result_error(kvtier_result* out, const kvformat::Error& error, const char* path,
                          int err) {
  if (error.reason == kvformat::Reason::IoError)
    return result_failure(out, KVTIER_E_IO, "io_error", err ? err : EIO, path, error.message);
  return result_failure(out, KVTIER_E_FORMAT, kvformat::reason_name(error.reason), 0, path,
                        error.message);
}

std::int32_t result_bad_argument(kvtier_result* out, std::string_view text) {
  return result_failure(out, KVTIER_E_ARGUMENT, "bad_argument", 0, nullptr, text);
}

}  // namespace storeio

extern "C" void kvtier_free(void* data) { std::free(data); }
