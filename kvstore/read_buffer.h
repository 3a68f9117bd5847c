// The buffer chunk reads land in (private to kvstorelib).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace kvstore {

// Hands out page-aligned memory. The kernel's copy from the page cache is
// sensitive to where the destination starts: on the bench VM, 64 KiB reads
// into a buffer at 16 mod 32 (where a large malloc lands) took about 12% more
// system time than into an aligned one.
template <class T>
struct PageAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{4096};
  PageAligned() = default;
  template <class U>
  PageAligned(const PageAligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const PageAligned<U>&) const { return true; }
};

using ReadBuffer = std::vector<uint8_t, PageAligned<uint8_t>>;

}  // namespace kvstore
