// The version calls of the C ABI (store_abi.h).
#include "fault.h"
#include "kvtier/store_abi.h"

#ifndef KVTIER_STORE_LIBRARY_VERSION
#error "KVTIER_STORE_LIBRARY_VERSION must come from the build (the VERSION file)"
#endif

extern "C" {

uint32_t kvtier_store_abi_version(void) { return KVTIER_STORE_ABI_VERSION; }

const char* kvtier_store_library_version(void) { return KVTIER_STORE_LIBRARY_VERSION; }

void kvtier_store_test_fault(int32_t op, int32_t err, uint32_t skip, uint32_t count) {
  storeio::set_fault(op, err, skip, count);
}

void kvtier_store_test_pace_reads(uint64_t bytes_per_second) {
  storeio::set_read_pace(bytes_per_second);
}

}  // extern "C"
