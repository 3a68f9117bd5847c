// The test fault seam (kvtier_store_test_fault): a process-wide plan that
// makes the next few system calls of one kind fail with a chosen errno.
#pragma once

#include <cstdint>

namespace storeio {

// errno to fail this operation with, or 0 to run it for real.
int injected_fault(std::int32_t op);

void set_fault(std::int32_t op, std::int32_t err, std::uint32_t skip, std::uint32_t count);

}  // namespace storeio
