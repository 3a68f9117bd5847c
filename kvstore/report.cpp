#include "kvtier/kvstore/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvtier/format/layout.h"
#include "kvtier/kvstore/gc.h"
#include "printable.h"

namespace kvstore {

using kvtier::printable;

ScanSummary summarize(const StoreScan& scan) {
  ScanSummary s;
  s.ranks = scan.ranks.size();
  for (const auto& r : scan.ranks) {
    s.chunks += r.chunks.size();
    s.manifests += r.manifests.size();
    s.bytes += r.bytes_total;
    s.keyed_ranks += !r.mac_key_id.empty();
  }
  for (const auto& f : all_findings(scan)) {
    (is_damage(f.kind) ? s.damage : s.garbage)++;
    s.by_kind[finding_name(f.kind)]++;
  }
  return s;
}

std::string findings_text(const std::vector<Finding>& findings) {
  std::string out;
  for (const auto& f : findings) out += fmt::format("{}: {}: {}\n", printable(f.rel), finding_name(f.kind), printable(f.detail));
  return out;
}

nlohmann::json findings_json(const std::vector<Finding>& findings) {
  auto arr = nlohmann::json::array();
  for (const auto& f : findings)
    arr.push_back({{"path", printable(f.rel)}, {"kind", finding_name(f.kind)}, {"detail", printable(f.detail)}});
  return arr;
}

std::string summary_text(const char* verb, const ScanSummary& s, std::string_view failure) {
  std::string kinds;
  for (const auto& [k, n] : s.by_kind) kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", n, k);
  std::string verdict = s.by_kind.empty()
                            ? std::string(failure.empty() ? "no problems" : "nothing found in what was scanned")
                            : fmt::format("{} finding(s): {}", s.damage + s.garbage, kinds);
  if (!failure.empty()) verdict += fmt::format("; {}", failure);
  // Issue 45: "no problems" said nothing of MACs it never checked.
  if (s.macs_unchecked)
    verdict += fmt::format("; MACs not checked in {} keyed rank(s) (give --key FILE to check them)", s.macs_unchecked);
  return fmt::format("{}: {} rank(s), {} chunk(s), {} manifest(s), {} bytes; {}\n", verb, s.ranks, s.chunks,
                     s.manifests, s.bytes, verdict);
}

nlohmann::json summary_json(const ScanSummary& s) {
  return {{"ranks", s.ranks},   {"chunks", s.chunks},   {"manifests", s.manifests},
          {"bytes", s.bytes},   {"damage", s.damage},   {"garbage", s.garbage},
          {"by_kind", s.by_kind}, {"keyed_ranks", s.keyed_ranks}, {"macs_unchecked", s.macs_unchecked}};
}

std::string plan_text(const Plan& plan, bool dry_run) {
  std::string out;
  const char* verb = dry_run ? "would delete" : "delete";
  for (const auto& it : plan.items)
    out += fmt::format("{} {}: {}: {} ({} bytes)\n", verb, printable(it.rel), reason_name(it.reason), printable(it.detail),
                       it.st.size);
  out += fmt::format("plan: {} file(s), {} bytes{}\n", plan.items.size(), plan.bytes,
                     dry_run ? " would be freed (dry run; --sweep deletes)" : "");
  for (const auto& r : plan.refusals) out += fmt::format("refusal: {}\n", printable(r));
  return out;
}

nlohmann::json plan_json(const Plan& plan) {
  auto items = nlohmann::json::array();
  for (const auto& it : plan.items)
    items.push_back({{"path", printable(it.rel)},
                     {"reason", reason_name(it.reason)},
                     {"detail", printable(it.detail)},
                     {"bytes", it.st.size},
                     {"manifest", it.manifest}});
  auto refusals = nlohmann::json::array();
  for (const auto& r : plan.refusals) refusals.push_back(printable(r));
  return {{"items", items}, {"bytes", plan.bytes}, {"refusals", refusals}};
}

std::string sweep_text(const SweepResult& r) {
  std::string out;
  for (const auto& s : r.skipped) out += fmt::format("kept {}: {}\n", printable(s.rel), s.why);
  for (const auto& e : r.errors) out += fmt::format("error {}\n", printable(e.line()));
  if (r.held)
    out += fmt::format("held {} payload(s): {} changed since planned, so what it names is unknown; run gc again\n",
                       r.held, printable(r.held_for));
  out += fmt::format("swept: {} file(s), {} bytes freed\n", r.deleted, r.bytes);
  return out;
}

nlohmann::json sweep_json(const SweepResult& r) {
  auto skipped = nlohmann::json::array();
  for (const auto& s : r.skipped) skipped.push_back({{"path", printable(s.rel)}, {"why", s.why}});
  auto errors = nlohmann::json::array();
  for (const auto& e : r.errors) errors.push_back(printable(e.line()));
  nlohmann::json held = nullptr;
  if (r.held) held = {{"payloads", r.held}, {"manifest", printable(r.held_for)}};
  return {{"deleted", r.deleted}, {"bytes", r.bytes}, {"skipped", skipped}, {"errors", errors}, {"held", held}};
}

std::string gc_report_text(const GcReport& r) {
  if (!r.sweep) {
    Plan all = r.tier_plan;
    for (const auto& rank : r.ranks) merge_plan(all, Plan(rank.plan));
    return plan_text(all, true);
  }
  std::string out;
  bool plan_refused = false;
  for (const auto& rank : r.ranks) {
    // Each rank's plan and sweep lines under its name (several ranks in a tier).
    if (rank.executed || rank.swept || rank.error) out += fmt::format("rank {}:\n", printable(rank.where));
    for (const auto& why : rank.refusals) out += fmt::format("refused {}\n", printable(why));
    plan_refused = plan_refused || (rank.refused && !rank.plan.refusals.empty());
    if (rank.executed) out += plan_text(rank.plan, false);
    if (rank.swept) out += sweep_text(*rank.swept);
    if (rank.error) out += fmt::format("error {}\n", printable(rank.error->line()));
  }
  if (!r.tier_plan.items.empty()) {
    out += plan_text(r.tier_plan, false);
    if (r.tier_swept) out += sweep_text(*r.tier_swept);
  }
  if (plan_refused)
    out += "gc: sweep refused for safety in some rank(s); nothing was deleted there (--force overrides)\n";
  return out;
}

void gc_report_json(const GcReport& r, nlohmann::json& out) {
  Plan all = r.tier_plan;
  for (const auto& rank : r.ranks) merge_plan(all, Plan(rank.plan));
  out["plan"] = plan_json(all);
  if (!r.sweep) return;
  auto sweeps = nlohmann::json::array();
  auto refusals = nlohmann::json::array();
  for (const auto& rank : r.ranks) {
    for (const auto& why : rank.refusals) refusals.push_back(printable(why));
    if (!rank.swept) continue;
    auto j = sweep_json(*rank.swept);
    j["rank"] = printable(rank.where);
    j["plan"] = plan_json(rank.plan);
    sweeps.push_back(j);
  }
  if (r.tier_swept) {
    auto j = sweep_json(*r.tier_swept);
    j["rank"] = nullptr;
    sweeps.push_back(j);
  }
  out["sweeps"] = sweeps;
  out["refused"] = refusals;
}

nlohmann::json header_json(const kvformat::ChunkHeader& h, uint64_t file_size) {
  auto segs = nlohmann::json::array();
  for (const auto& s : h.segments)
    segs.push_back({{"layer", s.layer},
                    {"kind", std::string(kvformat::segment_kind_name(s.kind))},
                    {"dtype", std::string(kvformat::dtype_name(s.dtype))},
                    {"offset", s.offset},
                    {"length", s.length},
                    {"shape", s.shape},
                    {"stride", s.stride},
                    {"part", s.part}});
  return {{"format_version", h.format_version},
          {"header_length", h.header_length()},
          {"checksum_algorithm", h.checksum_algorithm},
          {"namespace", kvformat::to_hex(h.namespace_hash)},
          {"group", h.group},
          {"key", h.key_hex()},
          {"boundary", h.boundary},
          {"payload_length", h.payload_length},
          {"payload_checksum", fmt::format("{:08x}", h.payload_checksum)},
          {"file_size", file_size},
          {"segments", segs}};
}

std::string header_text(const kvformat::ChunkHeader& h, uint64_t file_size) {
  std::string out;
  out += fmt::format("format_version      {}\n", h.format_version);
  out += fmt::format("header_length       {}\n", h.header_length());
  out += fmt::format("checksum_algorithm  {} (crc32)\n", h.checksum_algorithm);
  out += fmt::format("namespace           {}\n", kvformat::to_hex(h.namespace_hash));
  out += fmt::format("group               {}\n", h.group);
  out += fmt::format("key                 {}\n", h.key_hex());
  out += fmt::format("boundary            {}\n", h.boundary);
  out += fmt::format("payload_length      {}\n", h.payload_length);
  out += fmt::format("payload_checksum    {:08x}\n", h.payload_checksum);
  out += fmt::format("file_size           {}\n", file_size);
  out += fmt::format("segments            {}\n", h.segments.size());
  for (const auto& s : h.segments) {
    out += fmt::format("  layer {:>5} {:<8} part {:>3} {:<12} offset {} length {} shape [{}] stride [{}]\n",
                       s.layer, kvformat::segment_kind_name(s.kind), s.part, kvformat::dtype_name(s.dtype), s.offset,
                       s.length, fmt::join(s.shape, ", "), fmt::join(s.stride, ", "));
  }
  return out;
}

}  // namespace kvstore
