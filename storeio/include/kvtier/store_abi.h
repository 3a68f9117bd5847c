/* The store's data path behind a small, stable C ABI (libkvtier_store.so).
 *
 * The injected Python calls it through ctypes, which releases the GIL for
 * the duration of a call; every call but the read queue's work is
 * synchronous, reentrant and may run on any thread (several calls at once are
 * fine: each has its own threads).
 * One chunk file format: docs/FORMAT.md, encoded and checked by format/.
 *
 * Ownership: the library never keeps a pointer past the call's return (the
 * read queue keeps a submitted call's items until its ticket ends) and
 * never closes a descriptor it did not open. Every string is NUL-terminated.
 * The record calls (below) hand back output of variable size in memory they
 * allocate; the caller frees it with kvtier_free.
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

#define KVTIER_STORE_ABI_VERSION 7u /* 2: mac_key in both items (keyed stores);
                                       3: KVTIER_READ_SAFE_FOLDERS, unknown flags refused;
                                       4: mac_rank in both items (the v3 seal),
                                          kvtier_store_test_pace_reads;
                                       5: the record calls (kvtier_result,
                                          kvtier_free, kvtier_manifest_* ...);
                                       6: the name calls (kvtier_rank_base_name ...,
                                          kvtier_parse_name), kvtier_open,
                                          kvtier_load_key;
                                       7: the read queue (kvtier_read_queue_*),
                                          kvtier_store_test_hold_reads */

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
                             (KVTIER_READ_SAFE_FOLDERS); kvtier_load_key: reason
                             unsafe_key_file, the key file refused */
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

/* ---- read queue ------------------------------------------------------------ */

/* A restore's read must neither run on nor return to a Python thread: a
 * thread that needs the GIL to start or finish a read waits behind the
 * engine's stepping thread, which may keep the GIL for as long as a promotion
 * lasts (docs/ENGINE-RUNS.md, run 38). A queue runs kvtier_read_chunks calls
 * one after another, in submission order, on one thread of its own; the
 * caller submits and polls, and each call returns at once. One queue per
 * caller; its calls are safe from any thread. */
typedef struct kvtier_read_queue kvtier_read_queue;

/* A ticket's states. */
enum {
  KVTIER_TICKET_QUEUED = 0,
  KVTIER_TICKET_RUNNING = 1,
  KVTIER_TICKET_DONE = 2,      /* bad and seconds are filled */
  KVTIER_TICKET_CANCELLED = 3, /* never started: no item was touched */
  KVTIER_TICKET_UNKNOWN = -1,  /* no such ticket (or forgotten) */
};

/* A new queue and its thread; NULL when the thread cannot be started. */
KVTIER_STORE_API kvtier_read_queue* kvtier_read_queue_new(void);

/* Queues kvtier_read_chunks(items, count, threads, flags). Returns the
 * ticket (> 0), or -1 when the arguments are unusable as kvtier_read_chunks
 * judges them (nothing queued) or the queue is closing. The items and the
 * memory their runs name must stay valid, and untouched by the caller, until
 * the ticket is DONE or CANCELLED. */
KVTIER_STORE_API int64_t kvtier_read_queue_submit(kvtier_read_queue* queue,
                                                  kvtier_read_item* items, size_t count,
                                                  uint32_t threads, uint32_t flags);

/* The ticket's state, never waiting. DONE: *bad is kvtier_read_chunks's
 * return and *seconds the call's wall time (either pointer may be NULL). */
KVTIER_STORE_API int32_t kvtier_read_queue_poll(kvtier_read_queue* queue, int64_t ticket,
                                                int64_t* bad, double* seconds);

/* Waits until the ticket is DONE or CANCELLED, or `timeout_ms` passed (< 0:
 * no limit); then as kvtier_read_queue_poll. */
KVTIER_STORE_API int32_t kvtier_read_queue_wait(kvtier_read_queue* queue, int64_t ticket,
                                                int64_t timeout_ms, int64_t* bad,
                                                double* seconds);

/* Cancels a QUEUED ticket (it never starts); returns the state after: a
 * running one is left to finish. */
KVTIER_STORE_API int32_t kvtier_read_queue_cancel(kvtier_read_queue* queue, int64_t ticket);

/* Drops an ended ticket's record (its state becomes UNKNOWN); one not ended
 * is kept. */
KVTIER_STORE_API void kvtier_read_queue_forget(kvtier_read_queue* queue, int64_t ticket);

/* Cancels every queued ticket, waits for the running one, ends the thread
 * and frees the queue. NULL is nothing. */
KVTIER_STORE_API void kvtier_read_queue_free(kvtier_read_queue* queue);

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

/* ---- records (ABI 5) ---------------------------------------------------------
 *
 * The store's JSON records, its chunk headers and its MACs, encoded and
 * judged by format/ (docs/FORMAT.md 3-6, 9.1), so that the overlays run one
 * codec: this one. JSON crosses the ABI as UTF-8 text: what a call takes is
 * parsed strictly (FORMAT.md 4.1: no duplicate keys, no floats, at most 64
 * levels, at most 64 MiB), what it gives back is canonical JSON.
 *
 * Every call fills a kvtier_result and returns its status:
 *   KVTIER_OK;
 *   KVTIER_E_FORMAT: reason is the codec's reason name (bad_json, bad_field,
 *     unsupported_version, manifest_checksum_mismatch, manifest_inconsistent,
 *     mac_missing, mac_mismatch, truncated, header_checksum_mismatch, ... =
 *     kvformat::reason_name = fmt.Reason), for input a reader refuses or an
 *     encoder would not write;
 *   KVTIER_E_ARGUMENT (bad_argument): a NULL pointer where input belongs,
 *     input that is not the JSON shape the call takes, a keyed call to a
 *     library built without OpenSSL;
 *   KVTIER_E_MISSING (missing_file) / KVTIER_E_IO (io_error, sys_errno set):
 *     the calls that open a file.
 * A NULL `out` returns KVTIER_E_ARGUMENT and writes nothing. */

typedef struct kvtier_result {
  int32_t status;    /* KVTIER_OK or KVTIER_E_* */
  int32_t sys_errno; /* errno of an I/O failure, else 0 */
  uint8_t* data;     /* the call's output (length bytes and a NUL after them),
                        allocated here; free it with kvtier_free. NULL when the
                        call failed (but for kvtier_load_key's refusal) or has
                        no output */
  uint64_t length;
  char reason[KVTIER_REASON_BYTES];   /* "" when OK */
  char message[KVTIER_MESSAGE_BYTES]; /* for a log line; names the path when given */
} kvtier_result;

/* Frees a kvtier_result's data (NULL is fine). */
KVTIER_STORE_API void kvtier_free(void* data);

/* A boundary manifest (FORMAT.md 5) from `fields`, the JSON object its file
 * holds less "checksum" and "mac" (boundary, chain, checksum_algorithm,
 * chunk_tokens, format, groups, kind, namespace, rank; any layout). data:
 * the canonical file bytes, checksum filled in; with mac_key (a keyed store's
 * secret, FORMAT.md 3.6; NULL: none) also "mac". Judged as a reader would
 * judge the file: unsupported_version, bad_field, manifest_inconsistent ... */
KVTIER_STORE_API int32_t kvtier_manifest_encode(const char* fields, size_t length,
                                                const uint8_t* mac_key, uint32_t mac_key_length,
                                                kvtier_result* out);

/* A manifest file's bytes read in FORMAT.md 5's reader order; with mac_key
 * its MAC first (mac_missing, mac_mismatch: 3.6). data: the canonical bytes
 * of the manifest read, without "mac" (a v1 manifest stays v1). */
KVTIER_STORE_API int32_t kvtier_manifest_decode(const uint8_t* bytes, size_t length,
                                                const uint8_t* mac_key, uint32_t mac_key_length,
                                                kvtier_result* out);

/* A namespace record (FORMAT.md 4) from `record`, {"fenced": {...}, "info":
 * {...}}: its fenced part checked (unsupported_version, bad_field). data:
 * the canonical record bytes. */
KVTIER_STORE_API int32_t kvtier_namespace_record_encode(const char* record, size_t length,
                                                        kvtier_result* out);

/* A namespace record file's bytes read in FORMAT.md 4's reader order (at most
 * 1 MiB). data: the canonical bytes of the record read. */
KVTIER_STORE_API int32_t kvtier_namespace_record_decode(const uint8_t* bytes, size_t length,
                                                        kvtier_result* out);

/* The namespace hash of `fenced` (a JSON object): sha256 of its canonical
 * JSON, 32 bytes in data. With KVTIER_FENCED_CHECK its fields are checked
 * first, as a writer fences them (FORMAT.md 4: extra keys allowed). */
#define KVTIER_FENCED_CHECK 1u
KVTIER_STORE_API int32_t kvtier_namespace_hash(const char* fenced, size_t length, uint32_t flags,
                                               kvtier_result* out);

/* Canonical JSON (FORMAT.md 4.1) of any JSON value. data: the text. */
KVTIER_STORE_API int32_t kvtier_canonical_json(const char* json, size_t length,
                                               kvtier_result* out);

/* A pending record (FORMAT.md 9.1) listing `chunks`, a JSON array of
 * [group, "key hex"] in any order (repeats listed once). data: the canonical
 * record bytes (bad_field for a group or key the record cannot hold). */
KVTIER_STORE_API int32_t kvtier_pending_record_encode(const char* chunks, size_t length,
                                                      kvtier_result* out);

/* A pending record file's bytes read in FORMAT.md 9.1's reader order. data:
 * the canonical bytes of the record read. */
KVTIER_STORE_API int32_t kvtier_pending_record_decode(const uint8_t* bytes, size_t length,
                                                      kvtier_result* out);

/* Keep-K retention (FORMAT.md 6): `chains` holds one line per manifest,
 * each ended by a newline: its name, then each key of its chain, every field
 * after a tab (names and keys hold no tab or newline). data: the names kept,
 * ascending, each ended by a newline. keep 0 keeps all; keep > 1024:
 * field_out_of_range. */
KVTIER_STORE_API int32_t kvtier_kept_manifests(const char* chains, size_t length, uint32_t keep,
                                               kvtier_result* out);

/* The key's id a keyed store's fenced part carries as mac_key_id (FORMAT.md
 * 3.6): 16 hex digits in data, never the key. */
KVTIER_STORE_API int32_t kvtier_mac_key_id(const uint8_t* mac_key, uint32_t mac_key_length,
                                           kvtier_result* out);

/* A chunk header's fields (FORMAT.md 3.1). The segment table goes to the
 * caller's kvtier_segment array: the first min(num_segments, capacity)
 * entries; with num_segments > capacity, call again with room for all. */
typedef struct kvtier_chunk_header {
  uint16_t format_version; /* 1 or 2: a sealed file's is the plain header's */
  uint8_t checksum_algorithm;
  uint8_t key_hash_length;
  uint32_t group;
  uint64_t boundary;
  uint64_t payload_length;
  uint32_t payload_checksum;
  uint32_t header_length;
  uint32_t num_segments;
  uint32_t reserved; /* 0 */
  uint8_t namespace_hash[32];
  uint8_t key_hash[64]; /* key_hash_length bytes, then 0 */
} kvtier_chunk_header;

/* The file a keyed store holds is sealed (FORMAT.md 3.6): without the MAC
 * flag mac_missing, with no room for a MAC truncated; its header is read as
 * the plain one it seals and the size checked less the MAC. The MAC itself
 * needs the payload: kvtier_read_chunks checks it. */
#define KVTIER_HEADER_SEALED 1u

/* The header of the chunk file at `path` and its size checked (FORMAT.md
 * 3.5 steps 1-14; not the payload): opened O_RDONLY|O_NONBLOCK, no symlink
 * as the file or a folder on its path (io_error, ELOOP), a regular file only
 * (io_error, EINVAL); ENOENT is missing_file. The writer's dedup. */
KVTIER_STORE_API int32_t kvtier_read_chunk_header(const char* path, uint32_t flags,
                                                  kvtier_chunk_header* header,
                                                  kvtier_segment* segments, uint32_t capacity,
                                                  kvtier_result* out);

/* The plain header at the start of `bytes` (a file's first bytes, at least
 * its header_length of them when it has that many: 3.5 steps 1-13); the
 * file's size is not looked at. */
KVTIER_STORE_API int32_t kvtier_parse_chunk_header(const uint8_t* bytes, size_t length,
                                                   kvtier_chunk_header* header,
                                                   kvtier_segment* segments, uint32_t capacity,
                                                   kvtier_result* out);

/* The plain header (FORMAT.md 3.1: flags 0, version 1 or 2) of `header`'s
 * fields and `header->num_segments` entries of `segments` (their offsets and
 * lengths as given); header_length and reserved are not read. Refused as a
 * reader would refuse the bytes (unsupported_version, bad_key_hash,
 * field_out_of_range, bad_segment_table, reserved_nonzero for a v1 part).
 * data: the header_length bytes. */
KVTIER_STORE_API int32_t kvtier_encode_chunk_header(const kvtier_chunk_header* header,
                                                    const kvtier_segment* segments,
                                                    kvtier_result* out);

/* A whole chunk file held in memory checked (FORMAT.md 3.5, every step, the
 * payload's CRC included); with mac_key a keyed one, its MAC first as
 * kvtier_open_chunk checks it (mac_rank: the rank whose store it is in),
 * then the plain chunk it seals. The header as kvtier_parse_chunk_header
 * gives it. */
KVTIER_STORE_API int32_t kvtier_verify_chunk(const uint8_t* file, size_t length,
                                             const uint8_t* mac_key, uint32_t mac_key_length,
                                             uint32_t mac_rank, kvtier_chunk_header* header,
                                             kvtier_segment* segments, uint32_t capacity,
                                             kvtier_result* out);

/* The chunk file at `path` checked as kvtier_verify_chunk checks bytes,
 * opened as kvtier_read_chunk_header opens it; a plain one read in blocks of
 * `block_size` bytes (0: 8 MiB), a keyed one (mac_key) read whole. */
KVTIER_STORE_API int32_t kvtier_verify_chunk_file(const char* path, uint64_t block_size,
                                                  const uint8_t* mac_key,
                                                  uint32_t mac_key_length, uint32_t mac_rank,
                                                  kvtier_chunk_header* header,
                                                  kvtier_segment* segments, uint32_t capacity,
                                                  kvtier_result* out);

/* A plain chunk held in memory sealed for a keyed store (FORMAT.md 3.6):
 * the v3 seal for `mac_rank` under `salt` (16 bytes; NULL: drawn at random,
 * as a writer must), or with KVTIER_SEAL_V2 the v2 seal older stores hold
 * (tests and vectors only: writers seal v3). data: the sealed file;
 * bad_header_length when the bytes cannot hold their header. */
#define KVTIER_SEAL_V2 1u
KVTIER_STORE_API int32_t kvtier_seal_chunk(const uint8_t* chunk, size_t length,
                                           const uint8_t* mac_key, uint32_t mac_key_length,
                                           uint32_t mac_rank, const uint8_t* salt, uint32_t flags,
                                           kvtier_result* out);

/* A keyed chunk file held in memory, its MAC checked before anything else
 * (FORMAT.md 3.6: mac_missing, truncated, mac_mismatch; the v3 seal bound to
 * `mac_rank`, the rank whose store the file is in). data: the plain chunk it
 * seals (the flag cleared, version 3 back to 2), for the plain reader's
 * checks. */
KVTIER_STORE_API int32_t kvtier_open_chunk(const uint8_t* file, size_t length,
                                           const uint8_t* mac_key, uint32_t mac_key_length,
                                           uint32_t mac_rank, kvtier_result* out);

/* ---- names, opens and the key file (ABI 6) ---------------------------------
 *
 * FORMAT.md 2's file and folder names, built and parsed by format/'s layout
 * (the same code kvstore walks a store with), and the open every store path
 * gets. The name calls fill a kvtier_result as the record calls do; a name
 * that breaks FORMAT.md 2 is KVTIER_E_FORMAT, reason bad_name. Names cross
 * as bytes (pointer and length: no NUL needed); data is the name. */

/* <model> of a rank base name: FORMAT.md 2's sanitising (never fails). */
KVTIER_STORE_API int32_t kvtier_sanitize_model(const char* model, size_t length,
                                               kvtier_result* out);

/* <prefix>_<model>_<ns>_r<rank>: the model sanitised, <ns> the first 16 hex
 * digits of `namespace_hash` (32 bytes); bad_name for a prefix other than
 * [a-z0-9]{1,32} or a rank above 65535. */
KVTIER_STORE_API int32_t kvtier_rank_base_name(const char* prefix, size_t prefix_length,
                                               const char* model, size_t model_length,
                                               const uint8_t* namespace_hash, uint32_t rank,
                                               kvtier_result* out);

/* <hhh>/<hh>_g<g>/<hash>.bin of a chunk key (hex) and group (0..1023). */
KVTIER_STORE_API int32_t kvtier_chunk_rel_path(const char* key_hex, size_t length,
                                               uint32_t group, kvtier_result* out);

/* b<boundary>_<tip>.json (boundary 1..2^40, tip a key's hex). */
KVTIER_STORE_API int32_t kvtier_manifest_file_name(uint64_t boundary, const char* tip,
                                                   size_t length, kvtier_result* out);

/* <pid>.<tid>.json of pending/ (FORMAT.md 9.1; each 1..10^19-1). */
KVTIER_STORE_API int32_t kvtier_pending_file_name(uint64_t pid, uint64_t tid,
                                                  kvtier_result* out);

/* <final>.tmp.<pid>.<tid>, the temp of any of the names above. */
KVTIER_STORE_API int32_t kvtier_temp_name(const char* final_name, size_t length, uint64_t pid,
                                          uint64_t tid, kvtier_result* out);

/* A name of kind `kind` parsed back (bad_name when it is not one; an unknown
 * kind is bad_argument). data: its parts in decimal or as written, each
 * after the first preceded by a newline, in this order: */
enum {
  KVTIER_NAME_KEY_HEX = 1,    /* a chunk key's hex: the key itself */
  KVTIER_NAME_RANK_BASE = 2,  /* prefix, model, ns (16 hex), rank */
  KVTIER_NAME_CHUNK_PATH = 3, /* <hhh>/<hh>_g<g>/<hash>.bin: key hex, group */
  KVTIER_NAME_MANIFEST = 4,   /* boundary, tip */
  KVTIER_NAME_PENDING = 5,    /* pid, tid */
  KVTIER_NAME_TEMP = 6,       /* pid, tid, then the final name (last: it may
                                 hold a newline itself) */
};
KVTIER_STORE_API int32_t kvtier_parse_name(uint32_t kind, const char* name, size_t length,
                                           kvtier_result* out);

/* open(2) of a store path, as every reader and the writer open one
 * (FORMAT.md 2, issue 45): O_CLOEXEC added, and a symlink as the file or as
 * any folder on the way refused with ELOOP (openat2's RESOLVE_NO_SYMLINKS,
 * or one component at a time with O_NOFOLLOW on a kernel without it).
 * `flags` and `mode` are open(2)'s. Returns the descriptor (the caller's to
 * close), or -errno: -ENOENT, -ELOOP for a link, ...; unknown options
 * -EINVAL. */
#define KVTIER_OPEN_REGULAR 1u /* a regular file only: anything else (a FIFO,
                                  which a read would wait on, a device, a
                                  folder) is closed again, -EINVAL */
#define KVTIER_OPEN_WALK 2u    /* tests only: the component walk, openat2
                                  not tried */
KVTIER_STORE_API int32_t kvtier_open(const char* path, int32_t flags, uint32_t mode,
                                     uint32_t options);

/* A keyed store's key file (FORMAT.md 3.6) loaded after the checks ssh
 * makes of a private key (format/'s load_key_file, the same as kvstore's):
 * a regular file, not a symlink, owned by the calling user, no group or
 * other permission bit, 32..4096 bytes, not all zero, and not inside the
 * store folder `store` (NULL: no store to compare). data: the key. A
 * refusal (a missing file too) is KVTIER_E_UNSAFE, reason unsafe_key_file:
 * message names the file and the problem, never the key's bytes, and, unlike
 * every other failure, data holds the whole refusal (a long path may push
 * the problem out of message's bytes). */
KVTIER_STORE_API int32_t kvtier_load_key(const char* path, const char* store,
                                         kvtier_result* out);

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

/* Holds reads for tests (process-wide): while set, a queued call whose first
 * item's path starts with `prefix` waits, RUNNING, before it touches any
 * item; NULL releases every held call. Never set in production. */
KVTIER_STORE_API void kvtier_store_test_hold_reads(const char* prefix);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_STORE_ABI_H */
