// kvstore: verify, garbage-collect and report on the worker-local KV chunk
// store (docs/FORMAT.md, docs/KVSTORE.md). This file only wires CLI11 to the
// library, prints, and picks exit codes.
#include <fcntl.h>
#include <sys/stat.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <regex>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "conventions.h"
#include "metrics.h"
#include "kvtier/kvstore/atomic_file.h"
#include "kvtier/format/chunk_verifier.h"
#include "kvtier/format/header.h"
#include "kvtier/format/sealed_chunk.h"
#include "kvtier/kvstore/gc.h"
#include "kvtier/kvstore/progress.h"
#include "kvtier/kvstore/report.h"
#include "printable.h"
#include "kvtier/kvstore/scan.h"
#include "kvtier/kvstore/stat.h"
#include "kvtier/kvstore/store_perms.h"
#include "kvtier/kvstore/walk.h"
#include "cli_checks.h"
#include "mac_check.h"

namespace {

using namespace kvstore;

// Exit codes: the one table both tools share (cli/exit_codes.h, README).
namespace ec = kvtier::exit_code;
constexpr int kExitClean = ec::kOk;            // nothing wrong (gc: plan made or carried out)
constexpr int kExitProblems = ec::kNotExpected;  // verify: any finding; gc: damage found; inspect: invalid chunk
constexpr int kExitUsage = ec::kUsage;         // bad command line, a ROOT that does not exist
constexpr int kExitIo = ec::kIo;               // ROOT unreadable, an unlink or the textfile write failed
constexpr int kExitRefused = ec::kUnsafe;      // sweep refused for safety; nothing deleted there
constexpr int kExitBusy = ec::kBusy;           // a writer held the lock past --lock-timeout
constexpr int kExitNoStore = ec::kNoStore;     // ROOT holds no store

int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void print_error(const std::string& line) { fmt::print(stderr, "kvstore: {}\n", kvtier::printable(line)); }

// A JSON document as printed. Paths in it went through printable(); any other
// string from the file system that is not UTF-8 is replaced, never fatal.
std::string json_text(const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace); }

struct Common {
  std::string root, root_opt;  // ROOT positional or --root (the same in overlay)
  std::string command;
  bool json = false;
  double grace_s = 600;
  unsigned threads = 0;
  bool quiet = false;
  bool verbose = false;
  std::string prometheus;  // FILE, or "-" for stdout
  int64_t start_ns = 0;
  std::string key_file;  // verify --key: a keyed store's secret (never printed)
};

// Where the human report goes: stdout, or stderr when stdout carries the
// metrics (--prometheus -).
std::FILE* text_out(const Common& c) { return c.prometheus == "-" ? stderr : stdout; }

// A failure before or instead of a result: the message on stderr, and with
// --json the error object on stdout (never empty stdout).
int fail(const Common& c, int code, const std::string& message) {
  print_error(message);
  if (c.json) fmt::print("{}\n", json_text(kvtier::cli::error_json("kvstore", c.command, code, kvtier::printable(message))));
  return code;
}

// The JSON envelope every successful --json document shares.
void envelope(nlohmann::json& j, const Common& c, int code) {
  j["schema_version"] = kvtier::cli::kSchemaVersion;
  j["tool"] = "kvstore";
  j["command"] = c.command;
  j["ok"] = code == kExitClean;
  j["exit_code"] = code;
}

// Writes the command's textfile (also after a failure: the run series then
// say so, and the last success is carried over). Returns the exit code,
// turned into an I/O error when the write fails.
template <typename Render>
int write_metrics(const Common& c, int code, Render render) {
  if (c.prometheus.empty()) return code;
  kvstore_cli::RunInfo run{c.command, code, c.start_ns, wall_now_ns(), 0};
  run.last_success_s = code == kExitClean ? static_cast<double>(run.end_ns) / 1e9
                                          : kvstore_cli::previous_last_success(c.prometheus, c.command);
  std::string text = render(run);
  if (c.prometheus == "-") {
    fmt::print("{}", text);
    return code;
  }
  auto w = write_file_atomic(c.prometheus, text);
  if (!w) {
    print_error(w.error().line());
    return code == kExitClean ? kExitIo : code;
  }
  return code;
}

// What the summary line says after a failed run, instead of "no problems"
// (which would describe only what was scanned). Empty for 0 and 1.
std::string failure_words(int code) {
  switch (code) {
    case kExitRefused: return "sweep refused for safety in some rank(s) (exit 4)";
    case kExitIo: return "the run failed with an I/O error (exit 6)";
    case kExitBusy: return "a writer held the store lock: not swept (exit 7)";
    default: return "";
  }
}

// True when ROOT holds no rank folder and is not one itself: an empty folder
// (a store's disk not mounted, nothing written yet) included, never "no problems".
// A rank folder that is a symlink is a finding of its own, not "no store".
bool no_store_here(const StoreScan& scan) {
  for (const auto& f : scan.findings)
    if (f.kind == FindingKind::kUnsafeFolder) return false;
  return !scan.root_is_rank && scan.ranks.empty();
}

std::string no_store_message(const Common& c, const StoreScan& scan) {
  return fmt::format("{}: no store here ({}no rank folder <prefix>_<model>_<ns>_r<rank> in it, and it is not one)",
                     c.root, scan.findings.empty() ? "empty: the store's disk not mounted, or nothing written yet; " : "");
}

// Drops the per-file lines of a gc report unless -v: the summary is the
// default. A file kept because it changed is news, so it always shows.
std::string per_file_filter(const std::string& text, bool verbose) {
  if (verbose) return text;
  std::string out, line;
  std::istringstream in(text);
  while (std::getline(in, line))
    if ((line.rfind("would delete ", 0) != 0 && line.rfind("delete ", 0) != 0 && line.rfind("kept ", 0) != 0) ||
        line.ends_with(": changed since planned, kept"))
      out += line + "\n";
  return out;
}

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

bool root_missing(const std::string& root) {
  struct stat st;
  return ::lstat(root.c_str(), &st) != 0 && errno == ENOENT;
}

Result<Opened> open_store(const std::string& root) {
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
  o.serving_uid = serving_uid_for(c.root);
  return o;
}

bool show_progress(const Common& c) { return !c.json && !c.quiet && Progress::stderr_is_tty(); }

// The store, or the exit code of why not (after reporting it).
Result<Opened> open_checked(const Common& c, int* code) {
  if (root_missing(c.root)) {
    *code = fail(c, kExitUsage, fmt::format("{}: does not exist", c.root));
    return Error{};
  }
  auto store = open_store(c.root);
  if (!store) *code = fail(c, kExitIo, store.error().line());
  return store;
}

// Ends a scanning command once everything is written: the scan's records
// (one per chunk) are left to the kernel, which frees them at once, where
// freeing them one by one took 5-6 ms of a 0.5 s verify of 40,000 chunks.
// Nothing else is pending: metrics files were renamed into place, a sweep's
// deletes were synced, the store lock goes with the process, stdout is
// flushed here.
[[noreturn]] void exit_now(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

int run_verify(const Common& c) {
  int code = kExitClean;
  auto render = [](const ScanSummary* sum) {
    return [sum](const kvstore_cli::RunInfo& run) { return kvstore_cli::verify_metrics(sum, run); };
  };
  std::vector<std::uint8_t> key;
  if (!c.key_file.empty()) {
    // Before the store is opened: a key refused is bad input, nothing read.
    if (!mac_check::available())
      return write_metrics(c, fail(c, kExitUsage, "--key: this kvstore was built without OpenSSL (no MAC support)"),
                           render(nullptr));
    if (auto problem = mac_check::load_key(c.key_file, key, c.root); !problem.empty())
      return write_metrics(c, fail(c, kExitUsage, problem), render(nullptr));
  }
  auto store = open_checked(c, &code);
  if (!store) return write_metrics(c, code, render(nullptr));
  Progress progress(show_progress(c), "verify");
  auto opts = scan_options(c, true, &progress);
  opts.stat_chunks = false;  // verify plans nothing: a chunk read whole needs no fstat
  opts.mac_key = std::move(key);
  opts.judge_seals = true;
  auto scan = scan_store(store->fd.get(), store->name, opts);
  progress.finish();
  if (!scan) return write_metrics(c, fail(c, kExitIo, scan.error().line()), render(nullptr));
  if (no_store_here(*scan)) return write_metrics(c, fail(c, kExitNoStore, no_store_message(c, *scan)), render(nullptr));
  auto findings = all_findings(*scan);
  // A store others can change is a finding of its own (docs/DEPLOY.md, Security).
  if (auto unsafe = unsafe_store_folder(c.root, serving_uid_for(c.root)))
    findings.insert(findings.begin(), Finding{".", FindingKind::kUnsafeFolder, *unsafe});
  auto summary = summarize(*scan);
  if (c.key_file.empty()) summary.macs_unchecked = summary.keyed_ranks;
  code = findings.empty() ? kExitClean : kExitProblems;
  code = write_metrics(c, code, render(&summary));
  if (c.json) {
    nlohmann::json j = {{"root", c.root}, {"findings", findings_json(findings)}, {"summary", summary_json(summary)}};
    envelope(j, c, code);
    fmt::print("{}\n", json_text(j));
  } else {
    fmt::print(text_out(c), "{}", findings_text(findings));
    if (!c.quiet || code != kExitClean)
      fmt::print(text_out(c), "{}", summary_text("verify", summary, failure_words(code)));
  }
  exit_now(code);
}

struct GcArgs {
  bool sweep = false;
  bool force = false;
  bool verify_payloads = false;
  int keep = -1;  // -1: from the namespace record's info, else 2
  double lock_timeout_s = 30;
  std::string max_bytes;  // empty: no budget
};

// A rank the sweep skipped only because a writer held its lock.
bool lock_refused(const RankGc& r) {
  return r.busy;
}

int run_gc(const Common& c, const GcArgs& g) {
  int code = kExitClean;
  auto render = [](const GcReport* rep, const ScanSummary* sum) {
    return [rep, sum](const kvstore_cli::RunInfo& run) { return kvstore_cli::gc_metrics(rep, sum, run); };
  };
  auto store = open_checked(c, &code);
  if (!store) return write_metrics(c, code, render(nullptr, nullptr));
  // Never act on a store others can change: what it holds may be theirs.
  if (g.sweep)
    if (auto unsafe = unsafe_store_folder(c.root, serving_uid_for(c.root)))
      return write_metrics(c, fail(c, kExitRefused, fmt::format("sweep refused, nothing deleted: store folder not safe: {}", *unsafe)),
                           render(nullptr, nullptr));
  Progress progress(show_progress(c), g.sweep ? "sweep" : "gc");
  GcOptions o;
  if (g.keep >= 0) o.keep = static_cast<uint32_t>(g.keep);
  o.grace_ns = static_cast<int64_t>(c.grace_s * 1e9);
  o.verify_payloads = g.verify_payloads;
  o.threads = c.threads;
  o.progress = &progress;
  o.force = g.force;
  o.lock_timeout = std::chrono::milliseconds(static_cast<int64_t>(g.lock_timeout_s * 1000));
  o.serving_uid = serving_uid_for(c.root);
  if (!g.max_bytes.empty()) o.max_bytes = parse_size(g.max_bytes);  // the validator checked it
  auto report = g.sweep ? sweep_gc(store->fd.get(), store->name, o) : plan_gc(store->fd.get(), store->name, o);
  progress.finish();
  if (!report) return write_metrics(c, fail(c, kExitIo, report.error().line()), render(nullptr, nullptr));
  if (report->ranks.empty() && no_store_here(report->scan))
    return write_metrics(c, fail(c, kExitNoStore, no_store_message(c, report->scan)), render(nullptr, nullptr));
  // A sweep's summary and findings come from its scans under the lock.
  auto summary = summarize(report->scan);
  // A dry run found damage (its plan says what a sweep removes): 1. A sweep
  // that removed every damaged file it found repaired the store: 0; damage
  // it left (a file kept after a re-check, a kind gc never deletes): 1.
  const DamageCount damage = damage_after_sweep(*report);
  code = (g.sweep ? damage.left() : damage.found) > 0 ? kExitProblems : kExitClean;
  if (report->refused) {
    bool all_busy = true;
    for (const auto& r : report->ranks)
      if (r.refused && !lock_refused(r)) all_busy = false;
    code = all_busy ? kExitBusy : kExitRefused;
  } else if (report->io_failed) {
    code = kExitIo;
  }
  code = write_metrics(c, code, render(&*report, &summary));
  if (c.json) {
    nlohmann::json out = {{"root", c.root}, {"summary", summary_json(summary)},
                          {"findings", findings_json(all_findings(report->scan))}};
    gc_report_json(*report, out);
    envelope(out, c, code);
    fmt::print("{}\n", json_text(out));
  } else {
    // A dry run lists its plan (that is what it is for); a sweep prints its
    // summary, and each file only with -v (and always in --json).
    fmt::print(text_out(c), "{}", per_file_filter(gc_report_text(*report), c.verbose || !g.sweep));
    std::string words = failure_words(code);
    if (g.sweep && damage.found > 0 && words.empty())
      words = damage.left() == 0 ? fmt::format("all {} damaged removed by this sweep", damage.found)
                                 : fmt::format("{} of {} damaged left after this sweep", damage.left(), damage.found);
    if (!c.quiet || code != kExitClean || damage.found > 0)
      fmt::print(text_out(c), "{}", summary_text("gc", summary, words));
  }
  exit_now(code);
}

int run_stat(const Common& c) {
  int code = kExitClean;
  auto render = [](const StoreStats* st) {
    return [st](const kvstore_cli::RunInfo& run) { return kvstore_cli::stat_metrics(st, run); };
  };
  auto store = open_checked(c, &code);
  if (!store) return write_metrics(c, code, render(nullptr));
  Progress progress(show_progress(c), "stat");
  auto opts = scan_options(c, false, &progress);
  auto scan = scan_store(store->fd.get(), store->name, opts);
  progress.finish();
  if (!scan) return write_metrics(c, fail(c, kExitIo, scan.error().line()), render(nullptr));
  if (no_store_here(*scan)) return write_metrics(c, fail(c, kExitNoStore, no_store_message(c, *scan)), render(nullptr));
  auto stats = compute_stats(*scan, opts.now_ns);
  code = write_metrics(c, kExitClean, render(&stats));
  if (c.json) {
    auto j = stats_json(stats);
    envelope(j, c, code);
    fmt::print("{}\n", json_text(j));
  } else if (!c.quiet) {
    fmt::print(text_out(c), "{}", stats_text(stats));
  }
  exit_now(code);
}

std::string not_a_chunk_file(const std::string& file, const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return symlink_error(file).line();
  const char* what = S_ISDIR(st.st_mode)    ? "a folder"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) ? "a device"
                                                                     : "not a regular file";
  return fmt::format("{}: is {}, not a regular file; kvstore reads chunks only from regular files", file, what);
}

int run_inspect(const Common& c, const std::string& file) {
  bool json = c.json;
  if (root_missing(file)) return fail(c, kExitUsage, fmt::format("{}: does not exist", file));
  // One class, one code (as for ROOT): FILE is not something kvstore opens
  // as a chunk (a symlink, FIFO, folder, socket or device) is exit 6, and a
  // special file is never opened (a device could act on it).
  struct stat st;
  if (::lstat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return fail(c, kExitIo, not_a_chunk_file(file, st));
  int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) return fail(c, kExitIo, symlink_error(file).line());
    return fail(c, kExitIo, io_error(file, errno, "cannot open").line());
  }
  Fd guard(fd);
  if (::fstat(fd, &st) != 0) return fail(c, kExitIo, io_error(file, errno, "cannot stat").line());
  if (!S_ISREG(st.st_mode)) return fail(c, kExitIo, not_a_chunk_file(file, st));
  // A keyed store's chunk (FORMAT.md 3.6): the plain header it seals, the
  // payload CRC before its MAC; the MAC itself is verify --key's to check.
  const bool sealed = kvformat::is_sealed_fd(fd);
  auto hdr = sealed ? kvformat::read_sealed_header_fd(fd, static_cast<uint64_t>(st.st_size))
                    : kvformat::read_chunk_header_fd(fd);
  if (!hdr) {
    auto r = hdr.error().reason;
    if (r == kvformat::Reason::IoError) {
      return fail(c, kExitIo, fmt::format("{}: {}", file, hdr.error().message));
    }
    if (json) {
      nlohmann::json j{{"path", file}, {"valid", false}, {"error", kvformat::reason_name(r)},
                       {"message", hdr.error().message}};
      envelope(j, c, kExitProblems);
      fmt::print("{}\n", json_text(j));
    }
    else
      fmt::print("{}: invalid chunk: {}: {}\n", file, kvformat::reason_name(r), hdr.error().message);
    return kExitProblems;
  }
  std::vector<uint8_t> buf(8 << 20);
  auto full = sealed ? kvformat::verify_sealed_payload_fd(fd, *hdr, buf) : kvformat::verify_chunk_fd(fd, buf);
  std::string payload = full ? "ok" : std::string(kvformat::reason_name(full.error().reason));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (json) {
    auto j = header_json(*hdr, size);
    j["path"] = file;
    j["payload"] = payload;
    j["valid"] = full.ok();
    j["sealed"] = sealed;
    envelope(j, c, full ? kExitClean : kExitProblems);
    fmt::print("{}\n", json_text(j));
  } else {
    fmt::print("{}", header_text(*hdr, size));
    fmt::print("payload             {}\n", payload);
    if (sealed) fmt::print("mac                 present, not checked (kvstore verify --key)\n");
  }
  return full ? kExitClean : kExitProblems;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvstore: verify, garbage-collect and report on the KV chunk store (formats v1 and v2)", "kvstore"};
  app.footer(kvtier::cli::exit_code_help());
  app.require_subcommand(1);
  app.set_version_flag("--version", kvtier::cli::version_text("kvstore"));

  Common c;
  GcArgs g;
  std::string inspect_file;

  // The options every subcommand takes, so each one's --help lists them all.
  auto add_common = [&](CLI::App* sub, bool root, bool with_grace) {
    if (root) {
      sub->add_option("ROOT", c.root, "a rank base (<prefix>_<model>_<ns>_r<rank>) or the tier folder holding ranks");
      sub->add_option("--root", c.root_opt, "ROOT given as an option (as `overlay --root`)");
      sub->add_option("--threads", c.threads, "chunk reader threads (default min(4, cores))")
          ->check(whole_number(1))
          ->check(CLI::Range(1, 64));
    }
    sub->add_flag("--json", c.json, "one JSON document on stdout (docs/JSON.md), also on failure");
    sub->add_flag("-q,--quiet", c.quiet, "no progress line and no summary on success; problems still printed");
    sub->add_flag("-v,--verbose", c.verbose, "more detail: gc lists every file it plans or deletes");
    if (with_grace)
      sub->add_option("--grace", c.grace_s, "seconds before an unnamed chunk or a temp counts as garbage (default 600)")
          ->check(seconds_up_to(1e9, "1000000000"));
    sub->footer(kvtier::cli::exit_code_help());
  };
  auto add_prometheus = [&](CLI::App* sub) {
    sub->add_option("--prometheus", c.prometheus,
                    "write this command's node-exporter textfile to FILE (atomically), or to stdout with -");
  };

  auto* verify = app.add_subcommand("verify", "check every chunk's header and payload checksum, the namespace "
                                              "record and every manifest's references");
  add_common(verify, true, true);
  add_prometheus(verify);
  verify->add_option("--key", c.key_file,
                     "a keyed store's secret key FILE (GLM53_KV_OFFLOAD_KEY_FILE; private to this user): "
                     "also check every chunk's and manifest's MAC (docs/FORMAT.md 3.6)");

  auto* gc = app.add_subcommand("gc", "plan (default: dry run) or --sweep the deletion of garbage");
  add_common(gc, true, true);
  add_prometheus(gc);
  gc->add_flag("--sweep", g.sweep, "delete the plan's files (under the store lock, re-planned)");
  gc->add_flag("--force", g.force, "sweep despite refusal reasons (unreadable manifests, every manifest planned)");
  gc->add_option("--keep", g.keep, "keep-K boundaries per chain (default: the namespace record's "
                                   "info.keep_boundaries, else 2; 0 keeps every manifest)")
      ->check(whole_number(0))
      ->check(CLI::Range(0, 1024));
  gc->add_option("--lock-timeout", g.lock_timeout_s, "seconds to wait for writers to release the lock (default 30)")
      ->check(seconds_up_to(86400, "86400"));
  gc->add_option("--max-bytes", g.max_bytes,
                 "per rank: retire least recently used chain trees until the rank holds at most SIZE "
                 "(a number with its unit: B, K/M/G/T (also KB..TB) or KiB/MiB/GiB/TiB, e.g. 500G, as "
                 "GLM53_KV_OFFLOAD_DISK_GB takes it; FORMAT.md 8.1)")
      ->check(CLI::Validator([](std::string& s) { return size_problem(s); }, "SIZE"));
  gc->add_flag("--verify-payloads", g.verify_payloads, "also checksum every payload (slower; default: headers only)");

  auto* stat = app.add_subcommand("stat", "totals per rank, group and chain; boundary times");
  add_common(stat, true, false);
  add_prometheus(stat);

  auto* inspect = app.add_subcommand("inspect", "print one chunk file's header");
  inspect->add_option("FILE", inspect_file, "a chunk file")->required();
  add_common(inspect, false, false);

  c.json = kvtier::cli::wants_json(argc, argv);
  c.start_ns = wall_now_ns();
  if (argc == 1) {
    fmt::print(stderr, "{}", app.help());
    return kExitUsage;
  }
  // CLI11 answers --version as soon as it sees it, whatever else is there:
  // `kvstore --version extra` printed the version and exited 0.
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i)
    if (std::string_view(argv[i]) == "--version" && argc != 2) {
      print_error("--version takes no other arguments (see kvstore --help)");
      if (c.json)
        fmt::print("{}\n", json_text(kvtier::cli::error_json("kvstore", "", kExitUsage, "--version takes no other arguments")));
      return kExitUsage;
    }
  // Unknown commands and options first, with a suggestion, before CLI11
  // would report a missing required value instead.
  if (std::string bad = kvtier::cli::precheck(app, argc, argv); !bad.empty()) {
    bad += " (see kvstore --help)";  // the same line on stderr and in --json, as overlay gives it
    print_error(bad);
    if (c.json) fmt::print("{}\n", json_text(kvtier::cli::error_json("kvstore", "", kExitUsage, kvtier::printable(bad))));
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    fmt::print("{}", kvtier::cli::version_text("kvstore"));
    return kExitClean;
  } catch (const CLI::ParseError& e) {
    print_error(fmt::format("{} (see kvstore --help)", e.what()));
    if (c.json) fmt::print("{}\n", json_text(kvtier::cli::error_json("kvstore", "", kExitUsage, kvtier::printable(e.what()))));
    return kExitUsage;
  }
  c.command = app.get_subcommands().front()->get_name();
  auto usage = [&](const std::string& why) { return fail(c, kExitUsage, why + " (see kvstore " + c.command + " --help)"); };
  if (c.command != "inspect") {
    if (!c.root.empty() && !c.root_opt.empty() && c.root != c.root_opt)
      return usage("ROOT given twice, as " + c.root + " and --root " + c.root_opt);
    const bool given = app.get_subcommands().front()->count("ROOT") > 0 ||
                       app.get_subcommands().front()->count("--root") > 0;
    if (c.root.empty()) c.root = c.root_opt;
    if (c.root.empty())
      return usage(given ? "ROOT is empty (an empty string names no folder)" : "ROOT is required (positional or --root)");
  }
  if (c.quiet && c.verbose) return usage("-q and -v contradict each other");
  if (g.force && !g.sweep) return usage("--force only applies to --sweep");
  if (c.json && c.prometheus == "-") return usage("--json and --prometheus - both want stdout");
  try {
    if (*verify) return run_verify(c);
    if (*gc) return run_gc(c, g);
    if (*stat) return run_stat(c);
    if (*inspect) return run_inspect(c, inspect_file);
  } catch (const std::exception& e) {
    // Library code returns errors; this only catches allocation failures and the like.
    return fail(c, kExitIo, fmt::format("internal error: {}", e.what()));
  }
  return kExitUsage;
}
