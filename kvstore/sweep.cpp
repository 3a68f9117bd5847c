#include "kvtier/kvstore/sweep.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "kvtier/kvstore/walk.h"
#include "parallel.h"

namespace kvstore {

namespace {

// Payload unlinks in flight at once (they mostly wait on the device, not
// the CPU), and the fewest files worth a thread of their own.
constexpr size_t kUnlinkThreads = 8;
constexpr size_t kMinPerThread = 256;

// The directory being deleted from. Plan items are sorted by path, so each
// directory's files are contiguous: one open fd at a time. With `sync_each`
// it is fsynced (making its unlinks durable) when the sweep moves on;
// without, the caller makes all of them durable at once (syncfs).
class DirCache {
 public:
  DirCache(int root_fd, bool sync_each) : root_fd_(root_fd), sync_each_(sync_each) {}
  ~DirCache() { sync_all(); }

  Result<int> get(std::string_view parent) {
    if (fd_.valid() && parent == rel_) return fd_.get();
    sync_current();
    rel_ = std::string(parent);
    if (rel_.empty()) {
      int fd = ::openat(root_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) return io_error(".", errno, "cannot open directory");
      fd_ = Fd(fd);
      return fd_.get();
    }
    auto d = open_beneath(root_fd_, rel_, O_RDONLY | O_DIRECTORY);
    if (!d) return d.error();
    fd_ = std::move(*d);
    return fd_.get();
  }

  std::vector<Error> sync_all() {
    sync_current();
    return std::move(errs_);
  }

 private:
  void sync_current() {
    if (!fd_.valid()) return;
    if (sync_each_ && ::fsync(fd_.get()) != 0) errs_.push_back(io_error(rel_.empty() ? "." : rel_, errno, "fsync"));
    fd_ = Fd();
  }

  int root_fd_;
  bool sync_each_;
  std::string rel_;
  Fd fd_;
  std::vector<Error> errs_;
};

enum class Unlinked { kYes, kSkipped, kChanged, kFailed };

Unlinked unlink_checked(DirCache& dirs, const PlanItem& it, SweepResult& res, Error& err, Progress* progress) {
  auto [parent, name] = split_parent(it.rel);
  auto dfd = dirs.get(parent);
  if (!dfd) {
    if (dfd.error().err == ENOENT) {
      res.skipped.push_back({it.rel, "already gone"});
      return Unlinked::kSkipped;
    }
    err = dfd.error();
    return Unlinked::kFailed;
  }
  std::string n(name);
  struct stat st;
  if (::fstatat(*dfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) {
      res.skipped.push_back({it.rel, "already gone"});
      return Unlinked::kSkipped;
    }
    err = io_error(it.rel, errno, "cannot stat");
    return Unlinked::kFailed;
  }
  FileStat now = to_file_stat(st);
  if (now.dev != it.st.dev || now.ino != it.st.ino || now.size != it.st.size ||
      now.mtime_ns != it.st.mtime_ns || !S_ISREG(st.st_mode)) {
    res.skipped.push_back({it.rel, "changed since planned, kept"});
    return Unlinked::kChanged;
  }
  if (::unlinkat(*dfd, n.c_str(), 0) != 0) {
    if (errno == ENOENT) {
      res.skipped.push_back({it.rel, "already gone"});
      return Unlinked::kSkipped;
    }
    err = io_error(it.rel, errno, "cannot unlink");
    return Unlinked::kFailed;
  }
  res.deleted++;
  res.bytes += it.st.size;
  if (progress) progress->add_deleted(1, it.st.size);
  return Unlinked::kYes;
}

}  // namespace

Result<SweepResult> execute_plan(int root_fd, const Plan& plan, Progress* progress) {
  SweepResult res;
  if (progress) progress->add_sweep_plan(plan.items.size(), plan.bytes);
  {
    DirCache dirs(root_fd, true);
    for (const auto& it : plan.items) {
      if (!it.manifest) continue;
      Error err;
      auto done = unlink_checked(dirs, it, res, err, progress);
      if (done == Unlinked::kFailed) {
        dirs.sync_all();
        return err;  // no payload is touched after a failed manifest delete
      }
      if (done == Unlinked::kChanged && res.held_for.empty()) res.held_for = it.rel;
    }
    auto errs = dirs.sync_all();
    if (!errs.empty()) return errs.front();
  }
  if (!res.held_for.empty()) {
    for (const auto& it : plan.items) res.held += !it.manifest;
    return res;
  }
  // Payloads: tens of thousands of directories may be touched, so one
  // syncfs at the end instead of an fsync per directory. The order that
  // matters (manifests durable before any payload goes) is kept above.
  // Unlinks run on kUnlinkThreads threads, each on a contiguous slice of the
  // sorted plan: an unlink can wait on the device (freeing a file's blocks on
  // ext4 mounted `discard` without a journal issues a synchronous discard per
  // file), and those waits overlap only when several unlinks are in flight.
  size_t manifests_deleted = res.deleted;
  std::vector<const PlanItem*> payloads;
  for (const auto& it : plan.items)
    if (!it.manifest) payloads.push_back(&it);
  size_t slices = std::min<size_t>(kUnlinkThreads, (payloads.size() + kMinPerThread - 1) / kMinPerThread);
  std::vector<SweepResult> parts(std::max<size_t>(slices, 1));
  auto run_slice = [&](size_t s) {
    size_t begin = payloads.size() * s / parts.size(), end = payloads.size() * (s + 1) / parts.size();
    SweepResult& part = parts[s];
    DirCache dirs(root_fd, false);
    for (size_t i = begin; i < end; ++i) {
      Error err;
      if (unlink_checked(dirs, *payloads[i], part, err, progress) == Unlinked::kFailed) part.errors.push_back(err);
    }
    for (auto& e : dirs.sync_all()) part.errors.push_back(std::move(e));
  };
  parallel_for(parts.size(), static_cast<unsigned>(parts.size()), run_slice);
  // Slices are contiguous in path order, so the merged lists stay sorted.
  for (auto& part : parts) {
    res.deleted += part.deleted;
    res.bytes += part.bytes;
    for (auto& k : part.skipped) res.skipped.push_back(std::move(k));
    for (auto& e : part.errors) res.errors.push_back(std::move(e));
  }
  if (res.deleted > manifests_deleted && ::syncfs(root_fd) != 0) res.errors.push_back(io_error(".", errno, "syncfs"));
  return res;
}

}  // namespace kvstore
