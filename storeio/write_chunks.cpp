// kvtier_write_chunks (store_abi.h): chunk files written durably in
// FORMAT.md 7's order: temp (O_EXCL) -> data -> fdatasync -> rename; after
// every item of the call, one fsync per folder. Only then is an item OK.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fault.h"
#include "fd.h"
#include "item_status.h"
#include "kvtier/format/crc32.h"
#include "kvtier/format/header.h"
#if KVTIER_STORE_HAVE_MAC
#include "kvtier/format/mac.h"
#endif
#include "kvtier/store_abi.h"
#include "no_links.h"
#include "parallel.h"
#include "segments.h"

namespace storeio {
namespace {

// Bytes CRC'd and then written per pwritev: the write copies them while
// the CRC has just brought them into cache.
constexpr std::uint64_t kWindow = 1 << 20;
constexpr std::size_t kIovMax = 1024;

struct Failure {
  std::int32_t status;
  std::string reason;
  int err;
  std::string text;
};

Failure sys_failure(int err, const std::string& what) {
  const bool full = err == ENOSPC || err == EDQUOT;
  return {full ? KVTIER_E_NO_SPACE : KVTIER_E_IO, full ? "no_space" : "io_error", err,
          what + ": " + std::strerror(err)};
}

Failure bad_argument(std::string text) {
  return {KVTIER_E_ARGUMENT, "bad_argument", 0, std::move(text)};
}

// A system call that the fault seam may fail instead: the result, with
// errno set as the call would have.
template <class Call>
auto faultable(std::int32_t op, Call call) -> decltype(call()) {
  if (const int err = injected_fault(op)) {
    errno = err;
    return -1;
  }
  return call();
}

std::optional<Failure> write_all(int fd, std::vector<iovec> iov, std::uint64_t offset) {
  std::size_t first = 0;
  while (first < iov.size()) {
    const ssize_t n = faultable(KVTIER_FAULT_WRITE, [&] {
      return ::pwritev(fd, iov.data() + first,
                       static_cast<int>(std::min(iov.size() - first, kIovMax)),
                       static_cast<off_t>(offset));
    });
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_failure(errno, "write");
    }
    if (n == 0) return sys_failure(EIO, "write made no progress");
    offset += static_cast<std::uint64_t>(n);
    std::uint64_t left = static_cast<std::uint64_t>(n);
    while (left && first < iov.size()) {
      if (left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      } else {
        iov[first].iov_base = static_cast<std::uint8_t*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
        left = 0;
      }
    }
  }
  return std::nullopt;
}

// The payload from the runs at `offset`, window by window; its CRC.
std::optional<Failure> write_payload(int fd, std::uint64_t offset, const kvtier_write_item& item,
                                     std::uint32_t& crc) {
  std::uint32_t run = 0;
  std::uint64_t in_run = 0;
  std::vector<iovec> iov;
  while (run < item.num_runs) {
    iov.clear();
    std::uint64_t want = 0;
    while (run < item.num_runs && want < kWindow) {
      const kvtier_run& r = item.runs[run];
      const std::uint64_t take = std::min(r.length - in_run, kWindow - want);
      if (take) {
        const auto* src = reinterpret_cast<std::uint8_t*>(r.address + in_run);
        crc = kvformat::crc32({src, take}, crc);
        iov.push_back({const_cast<std::uint8_t*>(src), take});
        want += take;
        in_run += take;
      }
      if (in_run == r.length) {
        ++run;
        in_run = 0;
      }
    }
    if (want == 0) break;
    if (auto f = write_all(fd, iov, offset)) return f;
    offset += want;
  }
  return std::nullopt;
}

std::optional<Failure> check_arguments(const kvtier_write_item& item) {
  if (!item.path || !*item.path) return bad_argument("no path");
  if (!item.namespace_hash) return bad_argument("no namespace hash");
  if (!item.key_hash && item.key_hash_length) return bad_argument("no key hash");
  if (!item.segments && item.num_segments) return bad_argument("no segment table");
  if (!item.runs && item.num_runs) return bad_argument("no source runs");
#if KVTIER_STORE_HAVE_MAC
  if (item.mac_key && !item.mac_key_length) return bad_argument("an empty MAC key");
#else
  if (item.mac_key) return bad_argument("a keyed store, and this library was built without OpenSSL");
#endif
  std::uint64_t total = 0;
  for (std::uint32_t i = 0; i < item.num_runs; ++i) {
    if (item.runs[i].length && !item.runs[i].address) return bad_argument("a run at address 0");
    total += item.runs[i].length;
  }
  if (total != item.payload_length)
    return bad_argument("the runs hold " + std::to_string(total) + " bytes, the payload is " +
                        std::to_string(item.payload_length));
  return std::nullopt;
}

std::string temp_name(const std::string& name) {
  // fmt.temp_name: <final>.tmp.<pid>.<tid>, tid the writing thread's.
  return name + ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(static_cast<long>(::syscall(SYS_gettid)));
}

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The item's folder, opened without following a symlink anywhere on its
// path (FORMAT.md 2): the temp, the rename and the folder's fsync all act
// in it, never through a link someone put in the way.
int open_folder(const std::string& folder) { return open_no_links(folder.c_str(), O_RDONLY | O_DIRECTORY); }

Failure folder_failure(int err, const std::string& folder) {
  if (err == ELOOP)
    return {KVTIER_E_IO, "io_error", err,
            "open " + folder + ": the folder or one above it is a symlink (the store follows none)"};
  return sys_failure(err, "open " + folder);
}

// Private to the serving user, or group-readable (the group from the
// folder's setgid bit, store_perms.py); set on the descriptor too, since
// the umask may have taken bits from the mode given to open.
mode_t file_mode(std::uint32_t flags) { return (flags & KVTIER_WRITE_GROUP_READ) ? 0640 : 0600; }

std::optional<Failure> write_one(kvtier_write_item& item, std::uint32_t flags) {
  if (auto f = check_arguments(item)) return f;
  const auto segments = to_segments(item.segments, item.num_segments);
  if (!segments) return bad_argument("a segment with ndim > 6");

  kvformat::ChunkHeader h;
  std::memcpy(h.namespace_hash.data(), item.namespace_hash, h.namespace_hash.size());
  h.group = item.group;
  h.key_hash.assign(item.key_hash, item.key_hash + item.key_hash_length);
  h.boundary = item.boundary;
  h.segments = *segments;
  h.payload_length = item.payload_length;
  const std::uint32_t header_length = h.header_length();
  // Refuse bad fields before any file exists (the checksum is filled later).
  if (auto probe = kvformat::encode_header(h); !probe)
    return bad_argument(std::string(kvformat::reason_name(probe.error().reason)) + ": " +
                        probe.error().message);

  const std::string folder = folder_of(item.path), name = name_of(item.path);
  kvtier::Fd dir(open_folder(folder));
  if (!dir.valid()) return folder_failure(errno, folder);
  const std::string tmp = temp_name(name);
  const mode_t mode = file_mode(flags);
  kvtier::Fd fd(::openat(dir.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd.valid()) return sys_failure(errno, "create " + folder + "/" + tmp);
  auto fail = [&](Failure f) {
    fd = kvtier::Fd();
    ::unlinkat(dir.get(), tmp.c_str(), 0);
    return f;
  };
  if (::fchmod(fd.get(), mode) != 0) return fail(sys_failure(errno, "fchmod " + tmp));
  // Payload first, its CRC on the way; then the header that carries it.
  std::uint32_t crc = 0;
  if (auto f = write_payload(fd.get(), header_length, item, crc)) return fail(*f);
  h.payload_checksum = crc;
  auto bytes = kvformat::encode_header(h);
  if (!bytes) return fail(bad_argument(bytes.error().message));
  std::uint64_t sealed = 0;
#if KVTIER_STORE_HAVE_MAC
  if (item.mac_key) {
    // FORMAT.md 3.6, the v3 seal: version 3 and the MAC flag in the header,
    // then salt || GMAC(header || payload) under the chunk's own subkey
    // after the payload; a second pass over the source runs (the CRC's pass
    // came first because the header carries the CRC).
    const auto salt = kvformat::random_salt();
    if (!salt) return fail(sys_failure(EIO, "no random salt for the MAC"));
    kvformat::seal_header_v3(*bytes);
    kvformat::ChunkSealer sealer({item.mac_key, item.mac_key_length}, item.mac_rank, *salt);
    sealer.update(*bytes);
    for (std::uint32_t r = 0; r < item.num_runs; ++r)
      sealer.update({reinterpret_cast<const std::uint8_t*>(item.runs[r].address),
                     static_cast<std::size_t>(item.runs[r].length)});
    const kvformat::Trailer tag = sealer.trailer();
    if (auto f = write_all(fd.get(), {{const_cast<std::uint8_t*>(tag.data()), tag.size()}},
                           header_length + item.payload_length))
      return fail(*f);
    sealed = kvformat::kMacSize;
  }
#endif
  if (auto f = write_all(fd.get(), {{bytes->data(), bytes->size()}}, 0)) return fail(*f);
  if (faultable(KVTIER_FAULT_SYNC, [&] { return ::fdatasync(fd.get()); }) != 0)
    return fail(sys_failure(errno, "fdatasync"));
  if (::close(fd.release()) != 0) return fail(sys_failure(errno, "close"));
  if (faultable(KVTIER_FAULT_RENAME,
                [&] { return ::renameat(dir.get(), tmp.c_str(), dir.get(), name.c_str()); }) != 0)
    return fail(sys_failure(errno, "rename"));
  item.payload_checksum = crc;
  item.header_length = header_length;
  item.file_size = header_length + item.payload_length + sealed;
  return std::nullopt;
}

int sync_folder(const std::string& folder) {
  kvtier::Fd fd(open_folder(folder));
  if (!fd.valid()) return errno;
  if (faultable(KVTIER_FAULT_DIR_SYNC, [&] { return ::fsync(fd.get()); }) != 0) return errno;
  return 0;
}

}  // namespace
}  // namespace storeio

extern "C" int64_t kvtier_write_chunks(kvtier_write_item* items, size_t count, uint32_t threads,
                                       uint32_t flags) {
  if (count == 0) return 0;
  if (!items) return -1;
  std::vector<char> renamed(count, 0);
  storeio::parallel_for(count, storeio::thread_count(threads, count), [&](std::size_t i) {
    kvtier_write_item& item = items[i];
    item.payload_checksum = 0;
    item.header_length = 0;
    item.file_size = 0;
    const auto out = storeio::status_fields_of(item);
    try {
      if (auto f = storeio::write_one(item, flags)) {
        storeio::set_failure(out, f->status, f->reason, f->err, item.path, f->text);
      } else {
        renamed[i] = 1;
      }
    } catch (const std::exception& e) {  // allocation failure: never across the C ABI
      storeio::set_failure(out, KVTIER_E_IO, "io_error", ENOMEM, item.path, e.what());
    }
  });
  // One fsync per folder, after its renames: then the names are durable.
  std::map<std::string, std::vector<std::size_t>> folders;
  for (std::size_t i = 0; i < count; ++i)
    if (renamed[i]) folders[storeio::folder_of(items[i].path)].push_back(i);
  for (const auto& [folder, members] : folders) {
    const int err = storeio::sync_folder(folder);
    for (const std::size_t i : members) {
      kvtier_write_item& item = items[i];
      const auto out = storeio::status_fields_of(item);
      if (err == 0) {
        storeio::set_ok(out);
        continue;
      }
      ::unlink(item.path);  // a name that may not survive a crash is no chunk
      const auto f = storeio::sys_failure(err, "fsync " + folder);
      storeio::set_failure(out, f.status, f.reason, f.err, item.path, f.text);
      item.payload_checksum = item.header_length = 0;
      item.file_size = 0;
    }
  }
  int64_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) bad += items[i].status != KVTIER_OK;
  return bad;
}
