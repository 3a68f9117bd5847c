// Filling a kvtier_result (store_abi.h, the record calls of ABI 5): status,
// reason and message as a chunk item's (item_status.h), output bytes in
// memory allocated here for the caller to free with kvtier_free.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <string_view>

#include "kvtier/format/format_error.h"
#include "kvtier/store_abi.h"

namespace storeio {

// OK, with a copy of `data` (a NUL after it) as the output.
std::int32_t result_ok(kvtier_result* out, std::string_view data);
// `path` may be null; the message is "<path>: <text>".
std::int32_t result_failure(kvtier_result* out, std::int32_t status, std::string_view reason,
                            int err, const char* path, std::string_view text);
// The codec's verdict: KVTIER_E_FORMAT with its reason name (io_error: KVTIER_E_IO).
std::int32_t result_error(kvtier_result* out, const kvformat::Error& error,
                          const char* path = nullptr, int err = 0);
std::int32_t result_bad_argument(kvtier_result* out, std::string_view text);

// Runs one call's `body` (which fills `out`) after clearing `out`: a NULL
// out is refused untouched, and no exception crosses the C ABI (memory
// running out is io_error ENOMEM; anything else names itself as
// bad_argument, never silently OK).
template <class Body>
std::int32_t run_call(kvtier_result* out, Body&& body) {
  if (!out) return KVTIER_E_ARGUMENT;
  *out = kvtier_result{};
  try {
    return body();
  } catch (const std::bad_alloc&) {
    kvtier_free(out->data);
    out->data = nullptr;
    out->length = 0;
    return result_failure(out, KVTIER_E_IO, "io_error", ENOMEM, nullptr, "out of memory");
  } catch (const std::exception& e) {
    kvtier_free(out->data);
    out->data = nullptr;
    out->length = 0;
    return result_bad_argument(out, e.what());
  }
}

}  // namespace storeio
