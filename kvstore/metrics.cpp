#include "metrics.h"

#include <fmt/format.h>

#include <fstream>
#include <regex>
#include <sstream>

namespace kvstore_cli {
namespace {

class Writer {
 public:
  void family(const std::string& name, const char* type, const char* help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, const std::string& labels, double v) {
    out_ += labels.empty() ? fmt::format("{} {}\n", name, fmt_value(v)) : fmt::format("{}{{{}}} {}\n", name, labels, fmt_value(v));
  }
  void gauge(const std::string& name, const char* help, double v, const std::string& labels = "") {
    family(name, "gauge", help);
    sample(name, labels, v);
  }
  std::string take() { return std::move(out_); }

 private:
  static std::string fmt_value(double v) {
    if (v == static_cast<double>(static_cast<int64_t>(v)) && v < 9e15 && v > -9e15) return fmt::format("{}", static_cast<int64_t>(v));
    return fmt::format("{:.3f}", v);
  }
  std::string out_;
};

void run_series(Writer& w, const RunInfo& run) {
  std::string l = fmt::format("command=\"{}\"", run.command);
  w.gauge("kvstore_last_run_timestamp_seconds", "When this command last ran (end, Unix seconds).",
          static_cast<double>(run.end_ns) / 1e9, l);
  w.gauge("kvstore_last_run_duration_seconds", "How long the last run took.",
          static_cast<double>(run.end_ns - run.start_ns) / 1e9, l);
  w.gauge("kvstore_last_exit_code", "Exit code of the last run (README, Exit codes).", run.exit_code, l);
  w.gauge("kvstore_last_success_timestamp_seconds",
          "When this command last ended with exit 0 (Unix seconds; 0: never seen).", run.last_success_s, l);
}

}  // namespace

double previous_last_success(const std::string& path, const std::string& command) {
  if (path.empty() || path == "-") return 0;
  std::ifstream in(path);
  if (!in) return 0;
  std::stringstream ss;
  ss << in.rdbuf();
  std::regex re("^kvstore_last_success_timestamp_seconds\\{command=\"" + command + "\"\\} ([0-9.eE+-]+)$");
  std::string line;
  std::smatch m;
  while (std::getline(ss, line))
    if (std::regex_match(line, m, re)) return std::stod(m[1].str());
  return 0;
}

std::string verify_metrics(const kvstore::ScanSummary* s, const RunInfo& run) {
  Writer w;
  kvstore::ScanSummary none;
  const auto& v = s ? *s : none;
  w.gauge("kvstore_verify_ranks", "Ranks verified.", v.ranks);
  w.gauge("kvstore_verify_chunks", "Chunk files verified (header and payload checksum).", v.chunks);
  w.gauge("kvstore_verify_bytes", "Bytes of chunk files verified.", v.bytes);
  w.gauge("kvstore_verify_manifests", "Boundary manifests verified.", v.manifests);
  w.gauge("kvstore_verify_problems", "Findings of the last verify: corruption, truncation, broken references, garbage.",
          v.damage + v.garbage);
  w.gauge("kvstore_verify_damage", "Findings that are damage (corrupt or truncated chunks, broken manifests).", v.damage);
  w.family("kvstore_verify_findings", "gauge", "Findings of the last verify by kind.");
  for (const auto& [kind, n] : v.by_kind) w.sample("kvstore_verify_findings", fmt::format("kind=\"{}\"", kvstore::label_escape(kind)), n);
  run_series(w, run);
  return w.take();
}

std::string gc_metrics(const kvstore::GcReport* r, const kvstore::ScanSummary* s, const RunInfo& run) {
  Writer w;
  uint64_t planned_files = 0, planned_bytes = 0, deleted = 0, freed = 0, refused = 0;
  if (r) {
    auto add_plan = [&](const kvstore::Plan& p) {
      planned_files += p.items.size();
      planned_bytes += p.bytes;
    };
    add_plan(r->tier_plan);
    if (r->tier_swept) {
      deleted += r->tier_swept->deleted;
      freed += r->tier_swept->bytes;
    }
    for (const auto& rank : r->ranks) {
      add_plan(rank.plan);
      refused += rank.refused ? 1 : 0;
      if (rank.swept) {
        deleted += rank.swept->deleted;
        freed += rank.swept->bytes;
      }
    }
  }
  w.gauge("kvstore_gc_sweep", "1 when the last run was a sweep, 0 for a dry run.", r && r->sweep ? 1 : 0);
  w.gauge("kvstore_gc_planned_files", "Files the last gc planned to delete.", planned_files);
  w.gauge("kvstore_gc_planned_bytes", "Bytes the last gc planned to free.", planned_bytes);
  w.gauge("kvstore_gc_deleted_files", "Files the last sweep deleted.", deleted);
  w.gauge("kvstore_gc_freed_bytes", "Bytes the last sweep freed.", freed);
  w.gauge("kvstore_gc_refused_ranks", "Ranks the last sweep refused for safety or could not lock.", refused);
  w.gauge("kvstore_gc_damage", "Damage findings of the last gc scan.", s ? s->damage : 0);
  run_series(w, run);
  return w.take();
}

std::string stat_metrics(const kvstore::StoreStats* st, const RunInfo& run) {
  Writer w;
  kvstore::StoreStats none;
  const auto& s = st ? *st : none;
  uint64_t chunks = 0, bytes = 0, manifests = 0, temps = 0;
  for (const auto& r : s.ranks) {
    chunks += r.chunks;
    bytes += r.bytes;
    manifests += r.manifests;
    temps += r.temps;
  }
  w.gauge("kvstore_store_ranks", "Rank folders in the store.", s.ranks.size());
  w.gauge("kvstore_store_chunks", "Chunk files in the store.", chunks);
  w.gauge("kvstore_store_bytes", "Bytes of chunk files in the store.", bytes);
  w.gauge("kvstore_store_manifests", "Boundary manifests in the store.", manifests);
  w.gauge("kvstore_store_temps", "Writer temp files in the store.", temps);
  auto rl = [](const kvstore::RankStat& r) { return fmt::format("rank=\"{}\",base=\"{}\"", r.rank, kvstore::label_escape(r.name)); };
  auto per_rank = [&](const char* name, const char* help, auto value) {
    w.family(name, "gauge", help);
    for (const auto& r : s.ranks) w.sample(name, rl(r), value(r));
  };
  double now = static_cast<double>(s.now_ns) / 1e9;
  per_rank("kvstore_rank_chunks", "Chunk files per rank.", [](const auto& r) { return double(r.chunks); });
  per_rank("kvstore_rank_bytes", "Bytes of chunk files per rank.", [](const auto& r) { return double(r.bytes); });
  per_rank("kvstore_rank_manifests", "Boundary manifests per rank.", [](const auto& r) { return double(r.manifests); });
  per_rank("kvstore_rank_chains", "Chains (leaf manifests) per rank.", [](const auto& r) { return double(r.chains.size()); });
  per_rank("kvstore_rank_newest_boundary_timestamp_seconds",
           "When the newest boundary manifest was written (Unix seconds; 0: none).",
           [&](const auto& r) { return r.newest_boundary_age_s < 0 ? 0.0 : now - r.newest_boundary_age_s; });
  per_rank("kvstore_rank_oldest_boundary_timestamp_seconds",
           "When the oldest boundary manifest was written (Unix seconds; 0: none).",
           [&](const auto& r) { return r.oldest_boundary_age_s < 0 ? 0.0 : now - r.oldest_boundary_age_s; });
  w.family("kvstore_group_bytes", "gauge", "Bytes of chunk files per rank and KV-cache group.");
  for (const auto& r : s.ranks)
    for (const auto& g : r.groups)
      w.sample("kvstore_group_bytes", fmt::format("{},group=\"{}\",kind=\"{}\"", rl(r), g.group, kvstore::label_escape(g.kind)), g.bytes);
  w.family("kvstore_group_chunks", "gauge", "Chunk files per rank and KV-cache group.");
  for (const auto& r : s.ranks)
    for (const auto& g : r.groups)
      w.sample("kvstore_group_chunks", fmt::format("{},group=\"{}\",kind=\"{}\"", rl(r), g.group, kvstore::label_escape(g.kind)), g.chunks);
  run_series(w, run);
  return w.take();
}

}  // namespace kvstore_cli
