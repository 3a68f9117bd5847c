#include "kvtier/kvstore/gc.h"

#include <fcntl.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "kvtier/kvstore/lock.h"

namespace kvstore {

namespace {

int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ScanOptions scan_options(const GcOptions& g, int64_t now) {
  return {.payloads = g.verify_payloads, .threads = g.threads, .now_ns = now, .grace_ns = g.grace_ns,
          .progress = g.progress, .mac_key = {}, .serving_uid = g.serving_uid};
}

PlanOptions plan_options(const GcOptions& g, const RankInventory& inv, bool locked, int64_t now) {
  return {.keep = g.keep ? *g.keep : inv.keep_hint.value_or(2), .grace_ns = g.grace_ns, .now_ns = now,
          .locked = locked, .max_bytes = g.max_bytes};
}

// Namespace-record temps beside the rank bases, written outside the lock:
// planned only once their writer provably exited (scan's record_temp_is_dead).
Plan tier_plan(int root_fd, const std::vector<TempRec>& temps, const ScanOptions& so) {
  Plan p;
  for (const auto& t : temps)
    if (record_temp_is_dead(root_fd, t.rel, t.st, so))
      p.items.push_back({t.rel, DeleteReason::kStaleTemp, "namespace record temp older than the grace period", t.st,
                         false});
  for (const auto& it : p.items) p.bytes += it.st.size;
  return p;
}

std::string where_of(const std::string& rel) { return rel.empty() ? "." : rel; }

}  // namespace

Result<GcReport> plan_gc(int root_fd, const std::string& root_name, const GcOptions& opt) {
  int64_t now = wall_now_ns();
  auto so = scan_options(opt, now);
  auto scan = scan_store(root_fd, root_name, so);
  if (!scan) return scan.error();
  GcReport report;
  report.scan = std::move(*scan);
  for (const auto& inv : report.scan.ranks) {
    RankGc r;
    r.where = where_of(inv.rel);
    r.plan = make_plan(inv, plan_options(opt, inv, false, now));
    report.ranks.push_back(std::move(r));
  }
  report.tier_plan = tier_plan(root_fd, report.scan.record_temps, so);
  return report;
}

Result<GcReport> sweep_gc(int root_fd, const std::string& root_name, const GcOptions& opt) {
  int64_t now = wall_now_ns();
  auto so = scan_options(opt, now);
  auto tier = list_tier(root_fd, root_name, so);
  if (!tier) return tier.error();
  GcReport report;
  report.sweep = true;
  report.scan.root_is_rank = tier->root_is_rank;
  report.scan.findings = std::move(tier->findings);
  report.scan.record_temps = std::move(tier->record_temps);

  for (const auto& rank : tier->ranks) {
    RankGc r;
    r.where = where_of(rank.rel);
    Fd rank_dir;
    int rank_fd = root_fd;
    if (!rank.rel.empty()) {
      auto d = open_beneath(root_fd, rank.rel, O_RDONLY | O_DIRECTORY);
      if (!d) {
        r.error = d.error();
        report.io_failed = true;
        report.ranks.push_back(std::move(r));
        continue;
      }
      rank_dir = std::move(*d);
      rank_fd = rank_dir.get();
    }
    auto lock = lock_exclusive(rank_fd, opt.lock_timeout);
    if (!lock) {
      r.refusals.push_back(fmt::format("{}/{}", r.where, lock.error().line()));
      // Busy (a writer held it) or unsafe (not a regular file: even --force
      // must not sweep without a lock that keeps writers out); else I/O.
      r.busy = lock.error().kind == ErrorKind::kRefused;
      r.refused = r.busy || lock.error().kind == ErrorKind::kInvalid;
      (r.refused ? report.refused : report.io_failed) = true;
      report.ranks.push_back(std::move(r));
      continue;
    }
    // The one scan of this rank, under the lock: no writer is between
    // "chunk exists" and "manifest published" except as its pending record says.
    so.now_ns = wall_now_ns();
    auto inv = scan_rank(root_fd, rank.rel, rank.name, so, &report.scan.bytes_read);
    if (!inv) {
      r.error = inv.error();
      report.io_failed = true;
      report.ranks.push_back(std::move(r));
      continue;
    }
    r.plan = make_plan(*inv, plan_options(opt, *inv, true, so.now_ns));
    report.scan.ranks.push_back(std::move(*inv));
    if (!r.plan.refusals.empty() && (!opt.force || r.plan.unsafe)) {
      r.refusals = r.plan.refusals;
      r.refused = true;
      report.refused = true;
      report.ranks.push_back(std::move(r));
      continue;
    }
    r.executed = true;
    auto res = execute_plan(root_fd, r.plan, opt.progress);
    if (!res) {
      r.error = res.error();
      report.io_failed = true;
    } else {
      if (!res->errors.empty()) report.io_failed = true;
      // Still under LOCK_EX: a writer takes its next LOCK_SH after this and
      // sees the new generation. Best effort: a writer rescans on its own
      // bound too (FORMAT.md 8.1).
      if (res->deleted > 0) (void)lock->mark_swept();
      r.swept = std::move(*res);
    }
    report.ranks.push_back(std::move(r));
  }
  so.now_ns = wall_now_ns();
  report.tier_plan = tier_plan(root_fd, report.scan.record_temps, so);
  if (!report.tier_plan.items.empty()) {
    auto res = execute_plan(root_fd, report.tier_plan, opt.progress);
    if (!res || !res->errors.empty()) report.io_failed = true;
    if (res) report.tier_swept = std::move(*res);
  }
  std::sort(report.scan.findings.begin(), report.scan.findings.end());
  return report;
}

}  // namespace kvstore
