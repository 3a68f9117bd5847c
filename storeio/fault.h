// The test fault seam (kvtier_store_test_fault): a process-wide plan that
// makes the next few system calls of one kind fail with a chosen errno; a
// read pace (kvtier_store_test_pace_reads) that makes the store slow; and a
// hold (kvtier_store_test_hold_reads) that keeps queued reads from starting.
#pragma once

#include <cstdint>

namespace storeio {

// errno to fail this operation with, or 0 to run it for real.
int injected_fault(std::int32_t op);

void set_fault(std::int32_t op, std::int32_t err, std::uint32_t skip, std::uint32_t count);

// After `bytes` of payload arrived: sleeps until the process's reads, all
// threads together, stay at or under the pace set (none set: returns at once).
void pace_read(std::uint64_t bytes);

void set_read_pace(std::uint64_t bytes_per_second);  // 0: no pace

// kvtier_store_test_hold_reads: while a prefix is set, a queued read whose
// first path starts with it waits here (nullptr path: never held).
void wait_while_held(const char* path);

void set_read_hold(const char* prefix);  // nullptr: release

}  // namespace storeio
