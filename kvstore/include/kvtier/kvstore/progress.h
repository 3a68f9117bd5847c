// A one-line progress display on stderr for long runs: only when stderr is a
// terminal (quiet when piped), redrawn a few times a second by its own
// thread so workers only bump atomic counters.
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
  // `enabled` false makes every call a no-op (pipes, --json, --quiet).
  Progress(bool enabled, std::string label);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_total(uint64_t files, uint64_t bytes) {
    total_files_ = files;
    total_bytes_ = bytes;
  }
  void add(uint64_t files, uint64_t bytes) {
    files_.fetch_add(files, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void finish();  // erases the line

  static bool stderr_is_tty();

 private:
  void loop();
  void draw();

  bool enabled_;
  std::string label_;
  std::atomic<uint64_t> files_{0}, bytes_{0};
  std::atomic<uint64_t> total_files_{0}, total_bytes_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  int64_t start_ns_ = 0;
};

}  // namespace kvstore
