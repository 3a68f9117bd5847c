/* The store's data path behind a small, stable C ABI (libkvtier_store.so).
 *
 * The injected Python calls it through ctypes, which releases the GIL for
 * the duration of a call; every call is synchronous, reentrant and may run
 * on any thread (several calls at once are fine: each has its own threads).
 * One chunk file format: docs/FORMAT.md, encoded and checked by format/.
 *
 * Ownership: the library never keeps a pointer past the call's return and
 * never closes a descriptor it did not open. Every string is NUL-terminated.
 *
 * Versioning: KVTIER_STORE_ABI_VERSION changes whenever a struct, a
 * function's signature or a status/flag value changes meaning; the binding
 * (kv_store_format/native.py) refuses a library whose ABI or library
 * version differs from the ones it was shipped with.
 */
#ifndef KVTIER_STORE_ABI_H
#define KVTIER_STORE_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVTIER_STORE_ABI_VERSION 4u /* 2: mac_key in both items (keyed stores);
                                       3: KVTIER_READ_SAFE_FOLDERS, unknown flags refused;
                                       4: mac_rank in both items (the v3 seal),
                                          kvtier_store_test_pace_reads */

#if defined(__GNUC__)
#define KVTIER_STORE_API __attribute__((visibility("default")))
#else
#define KVTIER_STORE_API
#endif

/* ---- versions ------------------------------------------------------------ */

/* KVTIER_STORE_ABI_VERSION the library was built with. */
KVTIER_STORE_API uint32_t kvtier_store_abi_version(void);
/* The project version (the repository's VERSION file), e.g. "0.1.0". Static. */
KVTIER_STORE_API const char* kvtier_store_library_version(void);

/* ---- shared types ---------------------------------------------------------- */

/* A run of memory: the destination of a read or the source of a write. */
typedef struct kvtier_run {
  uint64_t address;
  uint64_t length;
} kvtier_run;

/* One segment table entry (FORMAT.md 3.3), as the fields of a header. The
 * reader compares a file's table with this boot's entry by entry (every
 * field); the writer encodes it. Unused shape/stride entries are 0. */
typedef struct kvtier_segment {
  uint32_t layer;
  uint8_t kind;  /* 1 kv, 2 conv, 3 temporal */
  uint8_t dtype; /* FORMAT.md's dtype ids */
  uint8_t ndim;  /* <= 6 */
  uint8_t part;  /* v2; 0 in v1 */
  uint64_t offset;
  uint64_t length;
  uint64_t shape[6];
  uint64_t stride[6];
} kvtier_segment;

/* Per-item status. `reason` (below) is the finer name; status is its class. */
enum {
  KVTIER_OK = 0,
  /* The file breaks FORMAT.md: reason is the codec's reason name (truncated,
   * bad_magic, header_checksum_mismatch, trailing_bytes,
   * payload_checksum_mismatch, ... = kvformat::reason_name = fmt.Reason). */
  KVTIER_E_FORMAT = 1,
  /* A well-formed file that is not the one expected: reason is one of
   * foreign_namespace, wrong_group, wrong_key, wrong_boundary,
   * manifest_mismatch (payload length or checksum), layout_mismatch. */
  KVTIER_E_MISMATCH = 2,
  KVTIER_E_MISSING = 3,   /* reason missing_file: ENOENT at open */
  KVTIER_E_IO = 4,        /* reason io_error; sys_errno says which (ELOOP: a symlink) */
  KVTIER_E_NO_SPACE = 5,  /* reason no_space; sys_errno ENOSPC or EDQUOT (writes) */
  KVTIER_E_ARGUMENT = 6,  /* reason bad_argument: the item itself is inconsistent */
  KVTIER_E_SKIPPED = 7,   /* reason skipped: not attempted (KVTIER_READ_STOP_ON_FAILURE) */
  KVTIER_E_UNSAFE = 8,    /* reason unsafe_folder: others could change the file's folder
                             (KVTIER_READ_SAFE_FOLDERS) */
};

#define KVTIER_REASON_BYTES 40
#define KVTIER_MESSAGE_BYTES 256

/* ---- read ------------------------------------------------------------------ */

/* One chunk file to read and verify into memory. Inputs first, then what the
 * call fills in. A failed item's destination bytes are garbage: the library
 * may have written any of them before it found the failure. */
typedef struct kvtier_read_item {
  /* in */
  const char* path; /* opened O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC, must be a
                       regular file; NULL: use fd */
  int32_t fd;       /* used when path is NULL: an open descriptor the caller
                       keeps (never closed here; read with pread/preadv only) */
  uint32_t group;   /* expected ORIGINAL group index */
  const uint8_t* namespace_hash; /* 32 bytes */
  const uint8_t* key_hash;
  uint32_t key_hash_length;
  uint32_t num_segments;
  uint64_t boundary;
  uint64_t payload_length;   /* as the manifest entry says */
  uint32_t payload_checksum; /* as the manifest entry says (CRC-32, zlib's) */
  uint32_t num_runs;
  const kvtier_segment* segments; /* the table this boot's layout expects */
  const kvtier_run* runs; /* where the payload goes, in payload order; the
                             lengths add up to payload_length */
  const uint8_t* mac_key; /* a keyed store's secret (FORMAT.md 3.6), or NULL:
                             the file must then be plain */
  uint32_t mac_key_length;
  uint32_t mac_rank; /* with mac_key: the rank whose store the file is in; a v3
                        sealed chunk's MAC binds it (another rank's chunk fails) */
  /* out */
  int32_t status;    /* KVTIER_OK or KVTIER_E_* */
  int32_t sys_errno; /* errno of an I/O failure, else 0 */
  uint64_t bytes_read; /* payload bytes read into the runs (== payload_length when OK) */
  char reason[KVTIER_REASON_BYTES];   /* "" when OK */
  char message[KVTIER_MESSAGE_BYTES]; /* for a log line; names the path when given */
} kvtier_read_item;

/* Stop starting items once one failed (a promotion fails whole anyway); the
 * ones never started get KVTIER_E_SKIPPED. */
#define KVTIER_READ_STOP_ON_FAILURE 1u
/* After a file's header checks pass, posix_fadvise(WILLNEED) its whole
 * payload before reading it: the disk gets the file's reads queued at once
 * instead of readahead's ramp. A hint: never changes a verdict. */
#define KVTIER_READ_WILLNEED 2u
/* Each item's path is a chunk file of a rank base (FORMAT.md 2:
 * <base>/<hhh>/<hh>_g<g>/<hash>.bin): before the file is opened, its two
 * folders must each be a real folder (not a link) owned by root or by the
 * calling user and writable by neither its group nor the world; else the
 * item fails with KVTIER_E_UNSAFE (unsafe_folder), the message naming the
 * folder, its mode and owner. A folder that does not exist is left to the
 * open (missing_file). The rank base and above are the caller's to check. */
#define KVTIER_READ_SAFE_FOLDERS 4u
/* Flag bits this library does not know refuse the call (-1): a caller that
 * asks for a check an older library lacks must not get a read without it. */

/* Reads and verifies `count` items on `threads` threads (0: one per core).
 * With fewer items than threads, each payload is read in parts of at least
 * 4 MiB on the spare threads (the parts' CRCs combined in order). Per item, in FORMAT.md 3.5's order: open, fstat,
 * header parse and checks, then namespace, group, key, boundary, payload
 * length and checksum, segment table, file size; then preadv of the payload
 * straight into the runs and its CRC-32 (ISA-L), computed over the bytes as
 * read. With mac_key: the file must carry the MAC flag (else mac_missing) and
 * its MAC (v3: AES-GMAC under the subkey of key, salt and mac_rank; a v2
 * seal: HMAC-SHA256), computed over the header and the payload as they lie
 * in the runs, must match (else mac_mismatch, judged before any other verdict
 * of the file, as FORMAT.md 3.6 orders); an item is OK only after that.
 * A library built without OpenSSL fails keyed items with bad_argument.
 * Returns the number of items not KVTIER_OK, or -1 when the arguments
 * themselves are unusable (items NULL with count > 0, or an unknown flag:
 * nothing was done). */
KVTIER_STORE_API int64_t kvtier_read_chunks(kvtier_read_item* items, size_t count,
                                            uint32_t threads, uint32_t flags);

/* ---- write ----------------------------------------------------------------- */

/* One chunk file to write durably. The header is encoded here from the
 * fields (format version 2, CRC-32 computed here over the runs). */
typedef struct kvtier_write_item {
  /* in */
  const char* path; /* the final path; its folder must exist. The temp file is
                       "<path>.tmp.<pid>.<tid>" (fmt.temp_name; tid = the
                       writing thread's gettid()), created O_EXCL 0600
                       (0640 with KVTIER_WRITE_GROUP_READ) */
  uint32_t group;
  uint32_t key_hash_length;
  const uint8_t* namespace_hash; /* 32 bytes */
  const uint8_t* key_hash;
  uint64_t boundary;
  uint64_t payload_length; /* the runs add up to it; the segments cover it */
  uint32_t num_segments;
  uint32_t num_runs;
  const kvtier_segment* segments;
  const kvtier_run* runs; /* the payload, in payload order */
  const uint8_t* mac_key; /* a keyed store's secret: the file is sealed
                             (FORMAT.md 3.6, the v3 seal: version 3, flag bit 0,
                             salt || AES-GMAC tag after the payload); NULL: a
                             plain file (version 2) */
  uint32_t mac_key_length;
  uint32_t mac_rank; /* with mac_key: the writing rank, bound into the MAC */
  /* out */
  int32_t status;    /* KVTIER_OK, KVTIER_E_NO_SPACE, KVTIER_E_IO, KVTIER_E_ARGUMENT */
  int32_t sys_errno;
  uint32_t payload_checksum; /* the CRC-32 written into the header */
  uint32_t header_length;
  uint64_t file_size; /* header_length + payload_length (+ 32 when sealed) */
  char reason[KVTIER_REASON_BYTES];
  char message[KVTIER_MESSAGE_BYTES];
} kvtier_write_item;

/* With mac_key the header carries version 3 and flag bit 0 and the file
 * ends with a fresh random salt and the AES-GMAC tag of header and payload
 * under the subkey of (key, salt, mac_rank) (FORMAT.md 3.6). */
/* Chunk files group-readable (0640) instead of private to the writing user
 * (0600); the group is the folder's (the writer makes folders setgid). */
#define KVTIER_WRITE_GROUP_READ 1u

/* Writes `count` items on `threads` threads (0: one per core). Per item:
 * temp file, header + payload (pwritev from the runs), fdatasync, rename over
 * the final path; after every item of the call is renamed, one fsync per
 * distinct folder. Only then is an item KVTIER_OK (durable, may be named by
 * a manifest). A failure removes the item's temp file (or, when the folder
 * fsync failed, the renamed file) and leaves other items alone. Returns the
 * number of items not KVTIER_OK, or -1 for unusable arguments. */
KVTIER_STORE_API int64_t kvtier_write_chunks(kvtier_write_item* items, size_t count,
                                             uint32_t threads, uint32_t flags);

/* ---- test seam --------------------------------------------------------------- */

/* Fault injection for tests (process-wide; 0 ops clears). After `skip`
 * successful operations of kind `op`, the next `count` fail with `err`
 * (e.g. ENOSPC) as if the system call had. Never set outside tests. */
enum {
  KVTIER_FAULT_NONE = 0,
  KVTIER_FAULT_WRITE = 1,   /* pwritev of a temp file */
  KVTIER_FAULT_SYNC = 2,    /* fdatasync of a temp file */
  KVTIER_FAULT_RENAME = 3,
  KVTIER_FAULT_DIR_SYNC = 4,
  KVTIER_FAULT_READ = 5,    /* preadv of a payload */
};
KVTIER_STORE_API void kvtier_store_test_fault(int32_t op, int32_t err, uint32_t skip,
                                              uint32_t count);

/* A slow store for benchmarks and the GPU suite (process-wide; 0 clears): the
 * payload reads of every thread together are paced to `bytes_per_second`,
 * each read sleeping after its bytes arrived. Never set in production. */
KVTIER_STORE_API void kvtier_store_test_pace_reads(uint64_t bytes_per_second);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_STORE_ABI_H */
