// LD_PRELOAD shim for test_vllm_fs_durable.py: logs fdatasync, fsync and
// rename calls (with the path behind each fd) to $FS_SYNC_LOG, then does the
// real call. It observes what a loaded extension does without ptrace, so the
// durability test also runs where strace is not allowed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void note(const char* call, const char* a, const char* b) {
  const char* log = getenv("FS_SYNC_LOG");
  if (!log) return;
  int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char line[8192];
  int n = snprintf(line, sizeof line, "%s %s %s\n", call, a, b ? b : "-");
  if (n > 0) (void)!write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
  close(fd);
}

static void fd_path(int fd, char* out, size_t size) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, out, size - 1);
  out[n > 0 ? n : 0] = '\0';
}

int fdatasync(int fd) {
  char p[4096];
  fd_path(fd, p, sizeof p);
  note("fdatasync", p, NULL);
  int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  return real(fd);
}

int fsync(int fd) {
  char p[4096];
  fd_path(fd, p, sizeof p);
  note("fsync", p, NULL);
  int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  return real(fd);
}

int rename(const char* from, const char* to) {
  note("rename", from, to);
  int (*real)(const char*, const char*) = (int (*)(const char*, const char*))dlsym(RTLD_NEXT, "rename");
  return real(from, to);
}
