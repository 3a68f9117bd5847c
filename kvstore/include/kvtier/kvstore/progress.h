// A one-line progress display on stderr for long runs: only when stderr is a
// terminal (quiet when piped), redrawn a few times a second by its own
// thread so workers only bump atomic counters.
//
// Two phases: the scan (files and folders seen; with verify, bytes read
// against the total once it is known) and the sweep (files deleted and bytes
// freed against the plans of the rank bases swept so far).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace kvstore {

class Progress {
 public:
  // `enabled` false: nothing is drawn (pipes, --json, --quiet); the counters
  // still count what callers add, so tests can read them. The scan adds only
  // when drawn() (its walker threads would share the counters' cache line for
  // nothing); the sweep always adds.
  Progress(bool enabled, std::string label);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Scan phase.
  void set_total(uint64_t files, uint64_t bytes) {
    total_files_ = files;
    total_bytes_ = bytes;
  }
  void add(uint64_t files, uint64_t bytes) {
    files_.fetch_add(files, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void add_dirs(uint64_t dirs) { dirs_.fetch_add(dirs, std::memory_order_relaxed); }

  // Sweep phase: from here on the line counts deletions against the plans
  // so far. gc sweeps each rank base under its own lock right after planning
  // it, so each rank's plan adds to the totals (nothing restarts).
  void add_sweep_plan(uint64_t planned_files, uint64_t planned_bytes) {
    if (!sweeping_.exchange(true)) {
      total_files_ = 0;
      total_bytes_ = 0;
    }
    total_files_ += planned_files;
    total_bytes_ += planned_bytes;
  }
  void add_deleted(uint64_t files, uint64_t bytes) {
    deleted_.fetch_add(files, std::memory_order_relaxed);
    freed_.fetch_add(bytes, std::memory_order_relaxed);
  }

  bool drawn() const { return enabled_; }
  uint64_t files() const { return files_.load(); }
  uint64_t dirs() const { return dirs_.load(); }
  uint64_t deleted() const { return deleted_.load(); }
  uint64_t freed() const { return freed_.load(); }

  // The line as drawn after `secs` seconds (no cursor codes).
  std::string line(double secs) const;

  void finish();  // erases the line

  static bool stderr_is_tty();

 private:
  void loop();
  void draw();

  bool enabled_;
  std::string label_;
  std::atomic<uint64_t> files_{0}, bytes_{0}, dirs_{0};
  std::atomic<uint64_t> total_files_{0}, total_bytes_{0};
  std::atomic<uint64_t> deleted_{0}, freed_{0};
  std::atomic<bool> sweeping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  int64_t start_ns_ = 0;
};

}  // namespace kvstore
