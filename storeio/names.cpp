// The name, open and key-file calls of the C ABI (store_abi.h, ABI 6):
// FORMAT.md 2's file and folder names built and parsed by format/'s layout,
// the one way a store file is opened, and a keyed store's key file loaded,
// so that the overlays keep no copy of any of them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "abi_result.h"
#include "kvtier/format/key_file.h"
#include "kvtier/format/layout.h"
#include "kvtier/store_abi.h"
#include "no_links.h"

namespace {

using storeio::result_bad_argument;
using storeio::result_error;
using storeio::result_ok;
using storeio::run_call;

std::string_view text_of(const char* data, std::size_t length) { return {data, length}; }

// A name built, or the codec's bad_name.
std::int32_t name_result(kvtier_result* out, const kvformat::Result<std::string>& name) {
  if (!name) return result_error(out, name.error());
  return result_ok(out, *name);
}

std::int32_t not_a(kvtier_result* out, std::string_view what, std::string_view name) {
  return result_error(out, kvformat::make_error(kvformat::Reason::BadName,
                                                "not a " + std::string(what) + ": " +
                                                    std::string(name)));
}

// The parts of a name, newline-separated in the order store_abi.h gives.
std::int32_t parse(kvtier_result* out, std::uint32_t kind, std::string_view name) {
  switch (kind) {
    case KVTIER_NAME_KEY_HEX:
      if (!kvformat::is_key_hex(name)) return not_a(out, "chunk key", name.substr(0, 80));
      return result_ok(out, name);
    case KVTIER_NAME_RANK_BASE: {
      auto p = kvformat::parse_rank_base_name(name);
      if (!p) return result_error(out, p.error());
      return result_ok(out, p->prefix + "\n" + p->model + "\n" + p->ns_short + "\n" +
                                std::to_string(p->rank));
    }
    case KVTIER_NAME_CHUNK_PATH: {
      auto p = kvformat::parse_chunk_rel_path(name);
      if (!p) return result_error(out, p.error());
      return result_ok(out, p->key + "\n" + std::to_string(p->group));
    }
    case KVTIER_NAME_MANIFEST: {
      auto p = kvformat::parse_manifest_file_name(name);
      if (!p) return result_error(out, p.error());
      return result_ok(out, std::to_string(p->boundary) + "\n" + p->tip);
    }
    case KVTIER_NAME_PENDING: {
      auto p = kvformat::parse_pending_file_name(name);
      if (!p) return not_a(out, "pending record name", name);
      return result_ok(out, std::to_string(p->pid) + "\n" + std::to_string(p->tid));
    }
    case KVTIER_NAME_TEMP: {
      auto p = kvformat::parse_temp_name(name);
      if (!p) return not_a(out, "temp name", name);
      // The final name last: it may hold a newline itself.
      return result_ok(out, std::to_string(p->pid) + "\n" + std::to_string(p->tid) + "\n" +
                                p->final_name);
    }
    default:
      return result_bad_argument(out, "unknown name kind " + std::to_string(kind));
  }
}

}  // namespace

extern "C" {

int32_t kvtier_sanitize_model(const char* model, size_t length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!model && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    return result_ok(out, kvformat::sanitize_model(text_of(model, length)));
  });
}

int32_t kvtier_rank_base_name(const char* prefix, size_t prefix_length, const char* model,
                              size_t model_length, const uint8_t* namespace_hash, uint32_t rank,
                              kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if ((!prefix && prefix_length) || (!model && model_length) || !namespace_hash)
      return result_bad_argument(out, "a NULL input");
    kvtier::Sha256Digest ns{};
    std::copy(namespace_hash, namespace_hash + ns.size(), ns.begin());
    return name_result(out, kvformat::rank_base_name(text_of(prefix, prefix_length),
                                                     text_of(model, model_length), ns, rank));
  });
}

int32_t kvtier_chunk_rel_path(const char* key_hex, size_t length, uint32_t group,
                              kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!key_hex && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    return name_result(out, kvformat::chunk_rel_path(text_of(key_hex, length), group));
  });
}

int32_t kvtier_manifest_file_name(uint64_t boundary, const char* tip, size_t length,
                                  kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!tip && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    return name_result(out, kvformat::manifest_file_name(boundary, text_of(tip, length)));
  });
}

int32_t kvtier_pending_file_name(uint64_t pid, uint64_t tid, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    return name_result(out, kvformat::pending_file_name(pid, tid));
  });
}

int32_t kvtier_temp_name(const char* final_name, size_t length, uint64_t pid, uint64_t tid,
                         kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!final_name && length)
      return result_bad_argument(out, "input is NULL with a nonzero length");
    return result_ok(out, kvformat::temp_name(text_of(final_name, length), pid, tid));
  });
}

int32_t kvtier_parse_name(uint32_t kind, const char* name, size_t length, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!name && length) return result_bad_argument(out, "input is NULL with a nonzero length");
    return parse(out, kind, text_of(name, length));
  });
}

int32_t kvtier_open(const char* path, int32_t flags, uint32_t mode, uint32_t options) {
  if (!path) return -EINVAL;
  if (options & ~(KVTIER_OPEN_REGULAR | KVTIER_OPEN_WALK)) return -EINVAL;
  const int fd = storeio::open_no_links(path, flags, static_cast<mode_t>(mode),
                                        (options & KVTIER_OPEN_WALK) != 0);
  if (fd < 0) return errno ? -errno : -EIO;
  if (options & KVTIER_OPEN_REGULAR) {
    // A FIFO opened O_NONBLOCK must not be read: a reader would wait on
    // whoever opens it for writing. Only a regular file passes.
    struct stat st {};
    const int err = ::fstat(fd, &st) != 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
    if (err) {
      ::close(fd);
      return -err;
    }
  }
  return fd;
}

int32_t kvtier_load_key(const char* path, const char* store, kvtier_result* out) {
  return run_call(out, [&]() -> std::int32_t {
    if (!path) return result_bad_argument(out, "no key file path");
    std::vector<std::uint8_t> key;
    const std::string refusal = kvformat::load_key_file(path, key, store ? store : "");
    if (refusal.empty())
      return result_ok(out, {reinterpret_cast<const char*>(key.data()), key.size()});
    // The whole refusal in data as well: a long path could push the problem
    // out of the message's 256 bytes.
    if (const auto r = result_ok(out, refusal); r != KVTIER_OK) return r;
    return storeio::result_failure(out, KVTIER_E_UNSAFE, "unsafe_key_file", 0, nullptr, refusal);
  });
}

}  // extern "C"
