// kvstore: verify, garbage-collect and report on the worker-local KV chunk
// store (docs/FORMAT.md, docs/KVSTORE.md). This file only wires CLI11 to the
// library, prints, and picks exit codes.
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvtier/kvstore/atomic_file.h"
#include "kvtier/format/chunk_verifier.h"
#include "kvtier/kvstore/gc.h"
#include "kvtier/kvstore/progress.h"
#include "kvtier/kvstore/report.h"
#include "kvtier/kvstore/scan.h"
#include "kvtier/kvstore/stat.h"
#include "kvtier/kvstore/walk.h"

namespace {

using namespace kvstore;

// Exit codes (documented in --help and docs/KVSTORE.md).
constexpr int kExitClean = 0;     // nothing wrong (gc: plan made or carried out)
constexpr int kExitProblems = 1;  // verify: any finding; gc: damage found; inspect: invalid chunk
constexpr int kExitUsage = 2;     // bad command line
constexpr int kExitIo = 3;        // ROOT unreadable, an unlink or the textfile write failed
constexpr int kExitRefused = 4;   // sweep refused for safety (or lock timeout); nothing deleted there

constexpr const char* kExitHelp =
    "Exit codes: 0 clean; 1 problems found (verify: any finding; gc: damage such as corrupt\n"
    "chunks or broken manifests; inspect: invalid chunk); 2 usage error; 3 I/O error;\n"
    "4 sweep refused for safety (unreadable manifest, plan deletes every manifest, bad\n"
    "namespace record, lock timeout) - nothing deleted in that rank.";

int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void print_error(const std::string& line) { fmt::print(stderr, "kvstore: {}\n", line); }

struct Common {
  std::string root;
  bool json = false;
  double grace_s = 600;
  unsigned threads = 0;
  bool quiet = false;
};

// ROOT's own name decides whether it is a rank base.
std::string root_name(const std::string& root) {
  char buf[PATH_MAX];
  if (::realpath(root.c_str(), buf) == nullptr) return root;
  std::string p(buf);
  auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

struct Opened {
  Fd fd;
  std::string name;
};

Outcome<Opened> open_store(const std::string& root) {
  auto fd = open_root(root);
  if (!fd) return fd.error();
  return Opened{std::move(*fd), root_name(root)};
}

ScanOptions scan_options(const Common& c, bool payloads, Progress* progress) {
  ScanOptions o;
  o.payloads = payloads;
  o.threads = c.threads;
  o.now_ns = wall_now_ns();
  o.grace_ns = static_cast<int64_t>(c.grace_s * 1e9);
  o.progress = progress;
  return o;
}

bool show_progress(const Common& c) { return !c.json && !c.quiet && Progress::stderr_is_tty(); }

int run_verify(const Common& c) {
  auto store = open_store(c.root);
  if (!store) {
    print_error(store.error().line());
    return kExitIo;
  }
  Progress progress(show_progress(c), "verify");
  auto scan = scan_store(store->fd.get(), store->name, scan_options(c, true, &progress));
  progress.finish();
  if (!scan) {
    print_error(scan.error().line());
    return kExitIo;
  }
  auto findings = all_findings(*scan);
  auto summary = summarize(*scan);
  int code = findings.empty() ? kExitClean : kExitProblems;
  if (c.json) {
    nlohmann::json j = {{"root", c.root},
                        {"findings", findings_json(findings)},
                        {"summary", summary_json(summary)},
                        {"exit", code}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}", findings_text(findings));
    fmt::print("{}", summary_text("verify", summary));
  }
  return code;
}

struct GcArgs {
  bool sweep = false;
  bool force = false;
  bool verify_payloads = false;
  int keep = -1;  // -1: from the namespace record's info, else 2
  double lock_timeout_s = 30;
};

int run_gc(const Common& c, const GcArgs& g) {
  auto store = open_store(c.root);
  if (!store) {
    print_error(store.error().line());
    return kExitIo;
  }
  Progress progress(show_progress(c), "gc");
  GcOptions o;
  if (g.keep >= 0) o.keep = static_cast<uint32_t>(g.keep);
  o.grace_ns = static_cast<int64_t>(c.grace_s * 1e9);
  o.verify_payloads = g.verify_payloads;
  o.threads = c.threads;
  o.progress = &progress;
  o.force = g.force;
  o.lock_timeout = std::chrono::milliseconds(static_cast<int64_t>(g.lock_timeout_s * 1000));
  auto report = g.sweep ? sweep_gc(store->fd.get(), store->name, o) : plan_gc(store->fd.get(), store->name, o);
  progress.finish();
  if (!report) {
    print_error(report.error().line());
    return kExitIo;
  }
  // A sweep's summary and findings come from its scans under the lock.
  auto summary = summarize(report->scan);
  int code = summary.damage > 0 ? kExitProblems : kExitClean;
  if (report->refused) code = kExitRefused;
  else if (report->io_failed) code = kExitIo;
  if (c.json) {
    nlohmann::json out = {{"root", c.root}, {"summary", summary_json(summary)},
                          {"findings", findings_json(all_findings(report->scan))}};
    gc_report_json(*report, out);
    out["exit"] = code;
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("{}", gc_report_text(*report));
    fmt::print("{}", summary_text("gc", summary));
  }
  return code;
}

int run_stat(const Common& c, const std::string& prometheus) {
  auto store = open_store(c.root);
  if (!store) {
    print_error(store.error().line());
    return kExitIo;
  }
  Progress progress(show_progress(c), "stat");
  auto opts = scan_options(c, false, &progress);
  auto scan = scan_store(store->fd.get(), store->name, opts);
  progress.finish();
  if (!scan) {
    print_error(scan.error().line());
    return kExitIo;
  }
  auto stats = compute_stats(*scan, opts.now_ns);
  if (!prometheus.empty()) {
    auto w = write_file_atomic(prometheus, stats_prometheus(stats));
    if (!w) {
      print_error(w.error().line());
      return kExitIo;
    }
  }
  if (c.json)
    fmt::print("{}\n", stats_json(stats).dump(2));
  else
    fmt::print("{}", stats_text(stats));
  return kExitClean;
}

int run_inspect(const std::string& file, bool json) {
  int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    print_error(io_error(file, errno, errno == ELOOP ? "is a symlink, not followed" : "cannot open").line());
    return kExitIo;
  }
  Fd guard(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    print_error(fmt::format("{}: not a regular file", file));
    return kExitIo;
  }
  auto hdr = kvformat::read_chunk_header_fd(fd);
  if (!hdr) {
    auto r = hdr.error().reason;
    if (r == kvformat::Reason::IoError) {
      print_error(fmt::format("{}: {}", file, hdr.error().message));
      return kExitIo;
    }
    if (json)
      fmt::print("{}\n", nlohmann::json{{"path", file}, {"valid", false},
                                        {"error", kvformat::reason_name(r)}, {"message", hdr.error().message}}
                             .dump(2));
    else
      fmt::print("{}: invalid chunk: {}: {}\n", file, kvformat::reason_name(r), hdr.error().message);
    return kExitProblems;
  }
  std::vector<uint8_t> buf(8 << 20);
  auto full = kvformat::verify_chunk_fd(fd, buf);
  std::string payload = full ? "ok" : std::string(kvformat::reason_name(full.error().reason));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (json) {
    auto j = header_json(*hdr, size);
    j["path"] = file;
    j["payload"] = payload;
    j["valid"] = full.ok();
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}", header_text(*hdr, size));
    fmt::print("payload             {}\n", payload);
  }
  return full ? kExitClean : kExitProblems;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvstore: verify, garbage-collect and report on the KV chunk store (format v1)"};
  app.footer(kExitHelp);
  app.require_subcommand(1);

  Common c;
  GcArgs g;
  std::string prometheus, inspect_file;
  bool inspect_json = false;

  auto add_common = [&](CLI::App* sub, bool with_grace) {
    sub->add_option("ROOT", c.root, "a rank base (<prefix>_<model>_<ns>_r<rank>) or the tier directory holding ranks")
        ->required();
    sub->add_flag("--json", c.json, "machine-readable output on stdout");
    sub->add_option("--threads", c.threads, "chunk reader threads (default min(4, cores))")->check(CLI::Range(1, 64));
    sub->add_flag("-q,--quiet", c.quiet, "no progress line");
    if (with_grace)
      sub->add_option("--grace", c.grace_s, "seconds before an unnamed chunk or a temp counts as garbage (default 600)")
          ->check(CLI::Range(0.0, 1e9));
    sub->footer(kExitHelp);
  };

  auto* verify = app.add_subcommand("verify", "check every chunk's header and payload checksum, the namespace "
                                              "record and every manifest's references");
  add_common(verify, true);

  auto* gc = app.add_subcommand("gc", "plan (default: dry run) or --sweep the deletion of garbage");
  add_common(gc, true);
  gc->add_flag("--sweep", g.sweep, "delete the plan's files (under the store lock, re-planned)");
  gc->add_flag("--force", g.force, "sweep despite refusal reasons (unreadable manifests, every manifest planned)");
  gc->add_option("--keep", g.keep, "keep-K boundaries per chain (default: the namespace record's "
                                   "info.keep_boundaries, else 2; 0 keeps every manifest)")
      ->check(CLI::Range(0, 1024));
  gc->add_option("--lock-timeout", g.lock_timeout_s, "seconds to wait for writers to release the lock (default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  gc->add_flag("--verify-payloads", g.verify_payloads, "also checksum every payload (slower; default: headers only)");

  auto* stat = app.add_subcommand("stat", "totals per rank, group and chain; boundary ages");
  add_common(stat, false);
  stat->add_option("--prometheus", prometheus, "also write a node-exporter textfile here (atomically)");

  auto* inspect = app.add_subcommand("inspect", "print one chunk file's header");
  inspect->add_option("FILE", inspect_file, "a chunk file")->required();
  inspect->add_flag("--json", inspect_json, "machine-readable output");
  inspect->footer(kExitHelp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  if (g.force && !g.sweep) {
    print_error("--force only applies to --sweep");
    return kExitUsage;
  }
  try {
    if (*verify) return run_verify(c);
    if (*gc) return run_gc(c, g);
    if (*stat) return run_stat(c, prometheus);
    if (*inspect) return run_inspect(inspect_file, inspect_json);
  } catch (const std::exception& e) {
    // Library code returns errors; this only catches allocation failures and the like.
    print_error(fmt::format("internal error: {}", e.what()));
    return kExitIo;
  }
  return kExitUsage;
}
