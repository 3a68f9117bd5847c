#include "kvtier/kvstore/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

namespace kvstore {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool Progress::stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(bool enabled, std::string label) : enabled_(enabled), label_(std::move(label)) {
  if (!enabled_) return;
  start_ns_ = now_ns();
  thread_ = std::thread([this] { loop(); });
}

Progress::~Progress() { finish(); }

void Progress::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, std::chrono::milliseconds(250));
    if (!stop_) draw();
  }
}

namespace {

std::string size_text(uint64_t bytes) {
  constexpr double kGiB = 1ULL << 30, kMiB = 1ULL << 20;
  auto b = static_cast<double>(bytes);
  return b >= kGiB ? fmt::format("{:.2f} GiB", b / kGiB) : fmt::format("{:.1f} MiB", b / kMiB);
}

}  // namespace

std::string Progress::line(double secs) const {
  if (sweeping_.load())
    return fmt::format("{}: deleted {}/{} files, {} of {} freed", label_, deleted_.load(), total_files_.load(),
                       size_text(freed_.load()), size_text(total_bytes_.load()));
  std::string out = fmt::format("{}: {} files in {} folders seen", label_, files_.load(), dirs_.load());
  uint64_t b = bytes_.load(), total = total_bytes_.load();
  if (b > 0) {
    out += fmt::format(", {} read", size_text(b));
    if (total > 0) out += fmt::format(" of {}", size_text(total));
    if (secs > 0) out += fmt::format(", {:.2f} GB/s", static_cast<double>(b) / secs / 1e9);
  }
  return out;
}

void Progress::draw() {
  double secs = static_cast<double>(now_ns() - start_ns_) / 1e9;
  std::fputs(("\r" + line(secs) + "\x1b[K").c_str(), stderr);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_) return;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::fputs("\r\x1b[K", stderr);
  std::fflush(stderr);
  enabled_ = false;
}

}  // namespace kvstore
