/* The C reference for bench/kvstore_bench.py: reads and CRC-32s files the way
 * `kvstore verify` does, and nothing else (no header parsing, no findings).
 *
 *   read_crc [-t THREADS] [-m] LISTFILE   prints the xor of all CRCs
 *
 * LISTFILE names one file a line (a list, not argv: 40,000 paths exceed
 * ARG_MAX).
 *
 * Per file: open; pread the first 512 KiB; with -m, the rest through mmap
 * (64 MiB windows, MAP_POPULATE), else pread in 512 KiB blocks; CRC-32 with
 * ISA-L when built with -DHAVE_ISAL, else zlib. Files are shared out to the
 * threads through one atomic counter, as kvstore does. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
static int nfiles, use_mmap;
static atomic_int next_file;
static atomic_uint total;

static void* worker(void* arg) {
  (void)arg;
  unsigned char* buf = malloc(kFirst);
  for (int i; (i = atomic_fetch_add(&next_file, 1)) < nfiles;) {
    int fd = open(files[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) { perror(files[i]); exit(1); }
    struct stat st;
    fstat(fd, &st);
    uint64_t size = (uint64_t)st.st_size, off = 0;
    uint32_t c = 0;
    ssize_t n = pread(fd, buf, kFirst, 0);
    if (n > 0) { c = crc(c, buf, (size_t)n); off = (uint64_t)n; }
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
  free(buf);
  return NULL;
}

int main(int argc, char** argv) {
  int threads = 1, a = 1;
  for (; a < argc && argv[a][0] == '-'; ++a) {
    if (!strcmp(argv[a], "-t") && a + 1 < argc) threads = atoi(argv[++a]);
    else if (!strcmp(argv[a], "-m")) use_mmap = 1;
  }
  if (a >= argc) { fprintf(stderr, "usage: read_crc [-t N] [-m] LISTFILE\n"); return 2; }
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
  pthread_t t[64];
  if (threads < 1) threads = 1;
  if (threads > 64) threads = 64;
  for (int i = 1; i < threads; ++i) pthread_create(&t[i], NULL, worker, NULL);
  worker(NULL);
  for (int i = 1; i < threads; ++i) pthread_join(t[i], NULL);
  printf("%08x\n", atomic_load(&total));
  return 0;
}
