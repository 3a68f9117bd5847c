#include "kvtier/kvstore/stat.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

namespace kvstore {

namespace {

double age_s(int64_t now_ns, int64_t mtime_ns) {
  return std::max(0.0, static_cast<double>(now_ns - mtime_ns) / 1e9);
}

// Leaves and chain depths. Chunk keys chain (each hash covers its prefix), so
// two chains with the same key at position i share their first i+1 keys: a
// manifest is an ancestor of another iff its tip sits at its own position in
// the other's chain.
std::vector<ChainStat> chains_of(const RankInventory& inv, int64_t now_ns) {
  std::set<std::pair<size_t, std::string>> inner;  // (position, key) strictly inside some chain
  std::set<std::pair<size_t, std::string>> ends;   // (position, key) of every manifest's tip
  for (const auto& m : inv.manifests) {
    if (!m.parsed || m.chain.empty()) continue;
    for (size_t i = 0; i + 1 < m.chain.size(); ++i) inner.emplace(i, m.chain[i]);
    ends.emplace(m.chain.size() - 1, m.chain.back());
  }
  std::vector<ChainStat> out;
  for (const auto& m : inv.manifests) {
    if (!m.parsed || m.chain.empty()) continue;
    if (inner.count({m.chain.size() - 1, m.chain.back()})) continue;  // not a leaf
    ChainStat c;
    c.leaf = m.rel;
    c.tip = m.chain.back();
    c.boundary = m.boundary;
    for (size_t i = 0; i < m.chain.size(); ++i) c.manifests += ends.count({i, m.chain[i]});
    c.age_s = age_s(now_ns, m.st.mtime_ns);
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const ChainStat& a, const ChainStat& b) { return a.leaf < b.leaf; });
  return out;
}

}  // namespace

std::string label_escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

StoreStats compute_stats(const StoreScan& scan, int64_t now_ns) {
  StoreStats s;
  s.now_ns = now_ns;
  for (const auto& inv : scan.ranks) {
    RankStat r;
    r.rel = inv.rel.empty() ? "." : inv.rel;
    r.name = inv.name;
    r.rank = inv.rank;
    r.chunks = inv.chunks.size();
    r.bytes = inv.bytes_total;
    r.manifests = inv.manifests.size();
    r.temps = inv.temps.size();
    std::map<uint32_t, GroupStat> groups;
    std::map<uint32_t, bool> parsed_any;
    for (const auto& c : inv.chunks) {
      auto& g = groups[c.group];
      g.group = c.group;
      g.chunks++;
      g.bytes += c.st.size;
      if (c.header_ok) {
        parsed_any[c.group] = true;
        if (c.state_group) g.kind = "state";
      }
    }
    for (auto& [id, g] : groups) {
      if (g.kind.empty()) g.kind = parsed_any[id] ? "full" : "unknown";
      r.groups.push_back(g);
    }
    r.chains = chains_of(inv, now_ns);
    for (const auto& m : inv.manifests) {
      double a = age_s(now_ns, m.st.mtime_ns);
      if (r.newest_boundary_age_s < 0 || a < r.newest_boundary_age_s) r.newest_boundary_age_s = a;
      r.oldest_boundary_age_s = std::max(r.oldest_boundary_age_s, a);
    }
    for (const auto& f : inv.findings) r.findings[finding_name(f.kind)]++;
    s.ranks.push_back(std::move(r));
  }
  return s;
}

std::string stats_text(const StoreStats& s) {
  std::string out;
  for (const auto& r : s.ranks) {
    out += fmt::format("rank {} ({}): {} chunk(s), {} bytes, {} manifest(s), {} chain(s), {} temp(s)\n", r.rank,
                       r.rel, r.chunks, r.bytes, r.manifests, r.chains.size(), r.temps);
    if (r.newest_boundary_age_s >= 0)
      out += fmt::format("  boundary age: newest {:.0f} s, oldest {:.0f} s\n", r.newest_boundary_age_s,
                         r.oldest_boundary_age_s);
    for (const auto& g : r.groups)
      out += fmt::format("  group {} ({}): {} chunk(s), {} bytes\n", g.group, g.kind, g.chunks, g.bytes);
    for (const auto& c : r.chains)
      out += fmt::format("  chain {}: boundary {}, {} manifest(s), age {:.0f} s\n", c.leaf, c.boundary, c.manifests,
                         c.age_s);
    for (const auto& [k, n] : r.findings) out += fmt::format("  findings {}: {}\n", k, n);
  }
  if (s.ranks.empty()) out += "no rank base found\n";
  return out;
}

nlohmann::json stats_json(const StoreStats& s) {
  auto ranks = nlohmann::json::array();
  for (const auto& r : s.ranks) {
    auto groups = nlohmann::json::array();
    for (const auto& g : r.groups)
      groups.push_back({{"group", g.group}, {"kind", g.kind}, {"chunks", g.chunks}, {"bytes", g.bytes}});
    auto chains = nlohmann::json::array();
    for (const auto& c : r.chains)
      chains.push_back({{"leaf", c.leaf},
                        {"tip", c.tip},
                        {"boundary", c.boundary},
                        {"manifests", c.manifests},
                        {"age_s", c.age_s}});
    nlohmann::json j = {{"path", r.rel},       {"name", r.name},          {"rank", r.rank},
                        {"chunks", r.chunks},  {"bytes", r.bytes},        {"manifests", r.manifests},
                        {"temps", r.temps},    {"groups", groups},        {"chains", chains},
                        {"findings", r.findings}};
    j["newest_boundary_age_s"] = r.newest_boundary_age_s >= 0 ? nlohmann::json(r.newest_boundary_age_s) : nullptr;
    j["oldest_boundary_age_s"] = r.oldest_boundary_age_s >= 0 ? nlohmann::json(r.oldest_boundary_age_s) : nullptr;
    ranks.push_back(std::move(j));
  }
  return {{"ranks", ranks}};
}

}  // namespace kvstore
