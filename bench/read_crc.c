/* The C reference for bench/kvstore_bench.py: reads and CRC-32s files the way
 * `kvstore verify` does, and nothing else (no header parsing, no findings).
 *
 *   read_crc [-t THREADS] [-m] [-n] LISTFILE   prints the xor of all CRCs
 *   read_crc [-t THREADS] [-m] [-n] -w ROOT    the same for every file below ROOT
 *
 * LISTFILE names one file a line (a list, not argv: 40,000 paths exceed
 * ARG_MAX). With -w the reference also finds the files itself, as kvstore
 * must: getdents64 on every directory, the root's subdirectories shared out
 * to the threads (kvstore's walk does the same), each file opened relative
 * to its directory.
 *
 * Per file: open; fstat; pread the first 512 KiB; with -m, the rest through
 * mmap (64 MiB windows, MAP_POPULATE), else pread in 512 KiB blocks; CRC-32
 * with ISA-L when built with -DHAVE_ISAL, else zlib. With -n there is no
 * fstat when the first read comes back short (the whole file), which is what
 * `kvstore verify` does. Reads land in a page-aligned buffer, as kvstore's do
 * (a buffer at 16 mod 32, where a large malloc lands, costs the kernel's copy
 * about 10% more). Files are shared out to the threads through one atomic
 * counter, as kvstore does. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef HAVE_ISAL
#include <isa-l/crc.h>
static uint32_t crc(uint32_t c, const unsigned char* p, size_t n) { return crc32_gzip_refl(c, p, n); }
#else
#include <zlib.h>
static uint32_t crc(uint32_t c, const unsigned char* p, size_t n) { return (uint32_t)crc32(c, p, (uInt)n); }
#endif

enum { kFirst = 512 << 10 };
static const uint64_t kWindow = (uint64_t)64 << 20;
static char** files;
static int nfiles, use_mmap, no_stat;
static atomic_int next_file;
static atomic_uint total;

static void read_one(int fd, unsigned char* buf) {
  struct stat st;
  uint64_t size = 0, off = 0;
  uint32_t c = 0;
  if (!no_stat) { fstat(fd, &st); size = (uint64_t)st.st_size; }
  ssize_t n = pread(fd, buf, kFirst, 0);
  if (n > 0) { c = crc(c, buf, (size_t)n); off = (uint64_t)n; }
  if (no_stat) {
    if (n == kFirst) { fstat(fd, &st); size = (uint64_t)st.st_size; } else size = off;
  }
  if (use_mmap) {
    for (uint64_t base = off - off % kWindow; base < size; base += kWindow) {
      size_t len = (size_t)(size - base < kWindow ? size - base : kWindow);
      unsigned char* p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)base);
      if (p == MAP_FAILED) { perror("mmap"); exit(1); }
      size_t skip = base < off ? (size_t)(off - base) : 0;
      c = crc(c, p + skip, len - skip);
      munmap(p, len);
    }
  } else {
    while (off < size && (n = pread(fd, buf, kFirst, (off_t)off)) > 0) {
      c = crc(c, buf, (size_t)n);
      off += (uint64_t)n;
    }
  }
  close(fd);
  atomic_fetch_xor(&total, c);
}

static unsigned char* page_buffer(void) {
  void* p = NULL;
  if (posix_memalign(&p, 4096, kFirst)) { perror("posix_memalign"); exit(1); }
  return p;
}

static void* worker(void* arg) {
  (void)arg;
  unsigned char* buf = page_buffer();
  for (int i; (i = atomic_fetch_add(&next_file, 1)) < nfiles;) {
    int fd = open(files[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) { perror(files[i]); exit(1); }
    read_one(fd, buf);
  }
  free(buf);
  return NULL;
}

struct dirent64_raw {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

static int is_dots(const char* n) { return n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2])); }

/* Reads every file below the open directory dfd (and closes it). */
static void walk_dir(int dfd, unsigned char* buf, char* dents, size_t dents_size) {
  /* Subdirectories are entered after the listing, so one buffer serves all levels. */
  size_t cap = 16, nsub = 0;
  char** subs = malloc(cap * sizeof *subs);
  long n;
  while ((n = syscall(SYS_getdents64, dfd, dents, dents_size)) > 0) {
    for (long off = 0; off < n;) {
      struct dirent64_raw* d = (struct dirent64_raw*)(dents + off);
      off += d->d_reclen;
      if (is_dots(d->d_name)) continue;
      unsigned char type = d->d_type;
      if (type == DT_UNKNOWN) {
        struct stat st;
        if (fstatat(dfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
        type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
      }
      if (type == DT_REG) {
        int fd = openat(dfd, d->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) { perror(d->d_name); exit(1); }
        read_one(fd, buf);
      } else if (type == DT_DIR) {
        if (nsub == cap) subs = realloc(subs, (cap *= 2) * sizeof *subs);
        subs[nsub++] = strdup(d->d_name);
      }
    }
  }
  for (size_t i = 0; i < nsub; ++i) {
    int sub = openat(dfd, subs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0) walk_dir(sub, buf, dents, dents_size);
    free(subs[i]);
  }
  free(subs);
  close(dfd);
}

static int root_fd;

static void* walker(void* arg) {
  (void)arg;
  unsigned char* buf = page_buffer();
  char* dents = malloc(64 << 10);
  for (int i; (i = atomic_fetch_add(&next_file, 1)) < nfiles;) {
    int sub = openat(root_fd, files[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0) walk_dir(sub, buf, dents, 64 << 10);
  }
  free(dents);
  free(buf);
  return NULL;
}

/* Lists ROOT: its files are read now, its subdirectories become the work list. */
static void list_root(const char* root) {
  root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) { perror(root); exit(1); }
  unsigned char* buf = page_buffer();
  char dents[64 << 10];
  size_t cap = 1024;
  files = malloc(cap * sizeof *files);
  long n;
  while ((n = syscall(SYS_getdents64, root_fd, dents, sizeof dents)) > 0) {
    for (long off = 0; off < n;) {
      struct dirent64_raw* d = (struct dirent64_raw*)(dents + off);
      off += d->d_reclen;
      if (is_dots(d->d_name)) continue;
      if (d->d_type == DT_REG) {
        int fd = openat(root_fd, d->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) read_one(fd, buf);
      } else if (d->d_type == DT_DIR || d->d_type == DT_UNKNOWN) {
        if ((size_t)nfiles == cap) files = realloc(files, (cap *= 2) * sizeof *files);
        files[nfiles++] = strdup(d->d_name);
      }
    }
  }
  free(buf);
}

int main(int argc, char** argv) {
  int threads = 1, a = 1, walk = 0;
  for (; a < argc && argv[a][0] == '-'; ++a) {
    if (!strcmp(argv[a], "-t") && a + 1 < argc) threads = atoi(argv[++a]);
    else if (!strcmp(argv[a], "-m")) use_mmap = 1;
    else if (!strcmp(argv[a], "-w")) walk = 1;
    else if (!strcmp(argv[a], "-n")) no_stat = 1;
  }
  if (a >= argc) { fprintf(stderr, "usage: read_crc [-t N] [-m] [-n] (LISTFILE | -w ROOT)\n"); return 2; }
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  pthread_t t[64];
  if (walk) {
    list_root(argv[a]);
    for (int i = 1; i < threads; ++i) pthread_create(&t[i], NULL, walker, NULL);
    walker(NULL);
    for (int i = 1; i < threads; ++i) pthread_join(t[i], NULL);
    printf("%08x\n", atomic_load(&total));
    return 0;
  }
  FILE* list = fopen(argv[a], "r");
  if (!list) { perror(argv[a]); return 1; }
  size_t cap = 1024;
  files = malloc(cap * sizeof *files);
  char* line = NULL;
  size_t len = 0;
  ssize_t got;
  while ((got = getline(&line, &len, list)) > 0) {
    if (line[got - 1] == '\n') line[--got] = 0;
    if (!got) continue;
    if ((size_t)nfiles == cap) files = realloc(files, (cap *= 2) * sizeof *files);
    files[nfiles++] = strdup(line);
  }
  fclose(list);
  for (int i = 1; i < threads; ++i) pthread_create(&t[i], NULL, worker, NULL);
  worker(NULL);
  for (int i = 1; i < threads; ++i) pthread_join(t[i], NULL);
  printf("%08x\n", atomic_load(&total));
  return 0;
}
