// Renders scan findings, gc plans and chunk headers as text (one line per
// item, stable order, for people and for exact-match tests) and as JSON.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvtier/format/header.h"
#include "kvtier/kvstore/inventory.h"
#include "kvtier/kvstore/gc_plan.h"
#include "kvtier/kvstore/scan.h"
#include "kvtier/kvstore/sweep.h"

namespace kvstore {

struct ScanSummary {
  size_t ranks = 0;
  size_t chunks = 0;
  size_t manifests = 0;
  uint64_t bytes = 0;
  size_t damage = 0;   // findings whose kind is_damage
  size_t garbage = 0;  // orphans and stale temps
  std::map<std::string, size_t> by_kind;
  size_t keyed_ranks = 0;     // ranks whose record fences a mac_key_id (FORMAT.md 3.6)
  size_t macs_unchecked = 0;  // of those, the ones whose MACs this run did not check (verify without --key)
};

ScanSummary summarize(const StoreScan& scan);

// "<path>: <kind>: <detail>" per finding.
std::string findings_text(const std::vector<Finding>& findings);
nlohmann::json findings_json(const std::vector<Finding>& findings);
// `failure`, when not empty, says why the run failed (the CLI's words); the
// line then never says "no problems", which would only describe the part
// that was scanned.
std::string summary_text(const char* verb, const ScanSummary& s, std::string_view failure = {});
nlohmann::json summary_json(const ScanSummary& s);

// "<action> <path>: <reason> (<bytes> bytes)" per item, then refusals.
std::string plan_text(const Plan& plan, bool dry_run);
nlohmann::json plan_json(const Plan& plan);
std::string sweep_text(const SweepResult& r);
nlohmann::json sweep_json(const SweepResult& r);

// gc's report: the dry run's plan, or per rank what the sweep refused,
// planned and did; JSON adds "plan" (and "sweeps", "refused") to `out`.
struct GcReport;
std::string gc_report_text(const GcReport& r);
void gc_report_json(const GcReport& r, nlohmann::json& out);

nlohmann::json header_json(const kvformat::ChunkHeader& h, uint64_t file_size);
std::string header_text(const kvformat::ChunkHeader& h, uint64_t file_size);

}  // namespace kvstore
