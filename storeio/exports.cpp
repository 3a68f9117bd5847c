// libkvtier_store.so's one translation unit of its own: everything comes
// from kvtier_storeio (linked whole); the kvtier_* functions are the only
// symbols with default visibility (KVTIER_STORE_API in store_abi.h).
#include "kvtier/store_abi.h"
