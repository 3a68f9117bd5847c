/* LD_PRELOAD shim for crash-consistency tests: counts the calls that delete
 * or replace a file (unlink, unlinkat, rename, renameat, renameat2) and
 * SIGKILLs the process just before the Nth one, so the tested program needs
 * no fault hook of its own. A kill before step N leaves exactly the state of
 * a crash after step N-1 (the page cache survives a process kill; a power
 * cut is not simulated).
 *
 *   KVTIER_CRASH_AT=N     kill before the Nth call (unset or 0: never kill)
 *   KVTIER_CRASH_LOG=F    append "<n> <call> <path>" per call to F, and
 *                         "<n> kill" before the kill; lets a test count steps
 *
 * Build: cc -shared -fPIC -O1 -o kill_at_step.so kill_at_step.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long crash_at;
static long calls;
static int log_fd = -1;

__attribute__((constructor)) static void crash_init(void) {
  const char *at = getenv("KVTIER_CRASH_AT");
  const char *log = getenv("KVTIER_CRASH_LOG");
  crash_at = at ? strtol(at, NULL, 10) : 0;
  if (log && *log) log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void log_line(const char *line) {
  if (log_fd < 0) return;
  size_t len = strlen(line), off = 0;
  while (off < len) {
    ssize_t n = write(log_fd, line + off, len - off);
    if (n <= 0) return;
    off += (size_t)n;
  }
}

/* One deletion step; never returns when it is the chosen one. */
static void step(const char *call, const char *path) {
  long n = __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
  char line[4400];
  snprintf(line, sizeof line, "%ld %s %s\n", n, call, path ? path : "(null)");
  log_line(line);
  if (crash_at > 0 && n == crash_at) {
    snprintf(line, sizeof line, "%ld kill\n", n);
    log_line(line);
    kill(getpid(), SIGKILL);
    _exit(137); /* not reached: SIGKILL cannot be caught */
  }
}

#define REAL(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

int unlink(const char *path) {
  step("unlink", path);
  return REAL(unlink)(path);
}

int unlinkat(int dirfd, const char *path, int flags) {
  step("unlinkat", path);
  return REAL(unlinkat)(dirfd, path, flags);
}

int rename(const char *from, const char *to) {
  step("rename", from);
  return REAL(rename)(from, to);
}

int renameat(int fromfd, const char *from, int tofd, const char *to) {
  step("renameat", from);
  return REAL(renameat)(fromfd, from, tofd, to);
}

int renameat2(int fromfd, const char *from, int tofd, const char *to, unsigned int flags) {
  step("renameat2", from);
  return REAL(renameat2)(fromfd, from, tofd, to, flags);
}
