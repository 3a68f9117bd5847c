// `kvstore stat`: totals per rank, group and chain, and boundary ages, as
// text, JSON or a node-exporter textfile.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvtier/kvstore/scan.h"

namespace kvstore {

struct GroupStat {
  uint32_t group = 0;
  std::string kind;  // "state" or "full" (from chunk headers), "unknown" if none parsed
  size_t chunks = 0;
  uint64_t bytes = 0;
};

// One chain: a leaf manifest and the manifests on its path from the root.
struct ChainStat {
  std::string leaf;  // manifest path
  std::string tip;
  uint64_t boundary = 0;
  size_t manifests = 0;
  double age_s = 0;  // age of the leaf manifest (mtime)
};

struct RankStat {
  std::string rel;
  std::string name;
  int rank = -1;
  size_t chunks = 0;
  uint64_t bytes = 0;
  size_t manifests = 0;
  size_t temps = 0;
  std::vector<GroupStat> groups;
  std::vector<ChainStat> chains;
  double newest_boundary_age_s = -1;  // -1: no manifest
  double oldest_boundary_age_s = -1;
  std::map<std::string, size_t> findings;
};

struct StoreStats {
  std::vector<RankStat> ranks;
  int64_t now_ns = 0;
};

StoreStats compute_stats(const StoreScan& scan, int64_t now_ns);
std::string stats_text(const StoreStats& s);
nlohmann::json stats_json(const StoreStats& s);

// A Prometheus label value with backslash, quote and newline escaped.
std::string label_escape(const std::string& v);

}  // namespace kvstore
