// The disk budget offline (kvstore gc --max-bytes): the same least recently
// used policy as the writer's kv_store_local/budget.py (FORMAT.md 8.1), so
// both retire the same chain trees from the same store.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "kvtier/kvstore/gc_plan.h"

namespace kvstore {

namespace {

struct Tree {
  std::string root;
  int64_t recency_ns = 0;
  std::vector<size_t> manifests;
  std::vector<size_t> chunks;
  bool pinned = false;
};

}  // namespace

std::optional<uint64_t> parse_size(const std::string& text) {
  static const std::map<std::string, unsigned __int128> kUnits = {
      {"B", 1},
      {"K", 1000},       {"KB", 1000},       {"M", 1000000},       {"MB", 1000000},
      {"G", 1000000000}, {"GB", 1000000000}, {"T", 1000000000000}, {"TB", 1000000000000},
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40}};
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  const std::string whole = text.substr(0, i);
  std::string frac;
  if (i < text.size() && text[i] == '.') {
    size_t j = ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    frac = text.substr(j, i - j);
    if (frac.empty()) return std::nullopt;
  }
  auto unit = kUnits.find(text.substr(i));
  if (whole.empty() || whole.size() > 19 || frac.size() > 12 || unit == kUnits.end()) return std::nullopt;
  if (!frac.empty() && unit->second == 1) return std::nullopt;  // no fractions of a byte
  unsigned __int128 v = std::stoull(whole) * unit->second;
  unsigned __int128 scale = 1, f = 0;
  for (char ch : frac) {
    scale *= 10;
    f = f * 10 + static_cast<unsigned>(ch - '0');
  }
  v += f * unit->second / scale;
  if (v == 0 || v >= (static_cast<unsigned __int128>(1) << 63)) return std::nullopt;
  return static_cast<uint64_t>(v);
}

std::string size_problem(const std::string& text) {
  if (parse_size(text)) return {};
  const size_t unit_at = text.find_first_not_of("0123456789.");
  if (!text.empty() && unit_at == std::string::npos)
    return "not a SIZE: " + text + " has no unit, and a bare number is ambiguous here (GLM53_KV_OFFLOAD_DISK_GB=" +
           text + " means " + text + " GB): write " + text + "G for GB or " + text + "B for bytes";
  auto lower = [](std::string v) {
    for (auto& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return v;
  };
  if (unit_at != std::string::npos && unit_at > 0)
    for (const char* u : {"b", "k", "kb", "kib", "m", "mb", "mib", "g", "gb", "gib", "t", "tb", "tib"})
      if (lower(text.substr(unit_at)) == u)
        return "not a SIZE: " + text + " (units are case-sensitive: B, K M G T, KB..TB, KiB..TiB; e.g. 500G)";
  return "not a SIZE: " + text +
         " (a number > 0 and its unit: B, K/M/G/T or KB..TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024); "
         "e.g. 500G)";
}

size_t plan_budget(const RankInventory& inv, const PlanOptions& opt, uint64_t planned,
                   const std::vector<bool>& planned_manifest, std::vector<PlanItem>& manifests,
                   std::vector<PlanItem>& rest) {
  uint64_t used = 0;
  for (const auto& c : inv.chunks) used += c.st.size;
  for (const auto& m : inv.manifests) used += m.st.size;
  for (const auto& t : inv.temps) used += t.st.size;
  for (const auto& p : inv.pendings) used += p.st.size;
  used = used > planned ? used - planned : 0;
  const uint64_t limit = *opt.max_bytes;
  if (used <= limit) return 0;

  std::map<std::string, Tree> trees;
  // Per chunk: how many remaining trees name it (a chunk goes with the last).
  std::vector<size_t> naming(inv.chunks.size(), 0);
  std::unordered_map<std::string, size_t> by_key;
  for (size_t i = 0; i < inv.manifests.size(); ++i) {
    const auto& m = inv.manifests[i];
    if (planned_manifest[i] || !m.parsed || m.chain.empty()) continue;
    Tree& t = trees[m.chain.front()];
    t.root = m.chain.front();
    t.recency_ns = std::max(t.recency_ns, m.st.mtime_ns);
    t.manifests.push_back(i);
    for (const auto& r : m.refs) {
      long c = r.chunk;
      if (c == ManifestRef::kUnresolved) {  // a synthetic inventory: match by group/key
        if (by_key.empty())
          for (size_t k = 0; k < inv.chunks.size(); ++k)
            by_key.emplace(fmt::format("{}/{}", inv.chunks[k].group, inv.chunks[k].key), k);
        auto it = by_key.find(fmt::format("{}/{}", r.group, r.key));
        c = it == by_key.end() ? ManifestRef::kNoChunk : static_cast<long>(it->second);
      }
      if (c >= 0 && static_cast<size_t>(c) < inv.chunks.size()) t.chunks.push_back(c);
    }
  }
  for (auto& [root, t] : trees) {
    std::sort(t.chunks.begin(), t.chunks.end());
    t.chunks.erase(std::unique(t.chunks.begin(), t.chunks.end()), t.chunks.end());
    for (size_t c : t.chunks) {
      ++naming[c];
      if (inv.chunks[c].pending) t.pinned = true;  // a live writer counts on it
    }
  }
  std::vector<Tree*> order;
  for (auto& [root, t] : trees) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const Tree* a, const Tree* b) {
    return std::tie(a->recency_ns, a->root) < std::tie(b->recency_ns, b->root);
  });
  const std::string why = fmt::format("least recently used chain tree over --max-bytes {}", limit);
  size_t retired = 0;
  uint64_t freed = 0;
  for (Tree* t : order) {
    if (used - freed <= limit) break;
    if (t->pinned) continue;
    ++retired;
    for (size_t i : t->manifests) {
      const auto& m = inv.manifests[i];
      freed += m.st.size;
      manifests.push_back({m.rel, DeleteReason::kBudget, why, m.st, true});
    }
    for (size_t c : t->chunks)
      if (--naming[c] == 0) {
        freed += inv.chunks[c].st.size;
        rest.push_back({inv.chunks[c].rel, DeleteReason::kBudget, why, inv.chunks[c].st, false});
      }
  }
  return retired;
}

}  // namespace kvstore
