#include "kvtier/format/retention.h"

#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace kvformat {

Result<std::vector<bool>> kept_chains(std::span<const std::span<const std::string>> chains,
                                      std::uint32_t keep) {
  if (keep > kMaxKeepBoundaries)
    return make_error(Reason::FieldOutOfRange, "keep " + std::to_string(keep));
  std::vector<bool> kept(chains.size(), keep == 0);
  if (keep == 0) return kept;
  // A trie over the chains: one node per distinct prefix, so ancestry costs one
  // hash lookup per chain element even for thousands of long chains. Edges are
  // (parent node, key) with the key viewed in `chains`: no string is built.
  struct Edge {
    std::uint32_t parent;
    std::string_view key;
    bool operator==(const Edge&) const = default;
  };
  struct EdgeHash {
    std::size_t operator()(const Edge& e) const { return std::hash<std::string_view>{}(e.key) * 31 + e.parent; }
  };
  std::unordered_map<Edge, std::uint32_t, EdgeHash> nodes;
  std::vector<std::vector<std::uint32_t>> paths(chains.size());
  std::unordered_map<std::uint32_t, std::vector<std::size_t>> chains_at;  // node -> chains ending there
  for (std::size_t c = 0; c < chains.size(); ++c) {
    std::uint32_t node = 0;
    auto& path = paths[c];
    path.reserve(chains[c].size());
    for (const auto& key : chains[c]) {
      const auto [it, inserted] =
          nodes.try_emplace(Edge{node, key}, static_cast<std::uint32_t>(nodes.size() + 1));
      node = it->second;
      path.push_back(node);
    }
    chains_at[node].push_back(c);
  }
  std::unordered_set<std::uint32_t> not_leaf;
  for (const auto& path : paths)
    for (std::size_t i = 0; i + 1 < path.size(); ++i)
      if (chains_at.contains(path[i])) not_leaf.insert(path[i]);
  for (std::size_t c = 0; c < chains.size(); ++c) {
    const auto& path = paths[c];
    const std::uint32_t end = path.empty() ? 0 : path.back();
    if (not_leaf.contains(end)) continue;
    kept[c] = true;
    std::uint32_t taken = 0;
    for (std::size_t i = path.size() - (path.empty() ? 0 : 1); i-- > 0 && taken + 1 < keep;) {
      const auto it = chains_at.find(path[i]);
      if (it == chains_at.end()) continue;
      for (std::size_t a : it->second) kept[a] = true;
      ++taken;
    }
  }
  return kept;
}

Result<std::set<std::string>> kept_manifests(
    const std::map<std::string, std::vector<std::string>>& chains, std::uint32_t keep) {
  std::vector<std::span<const std::string>> views;
  views.reserve(chains.size());
  for (const auto& [name, chain] : chains) views.emplace_back(chain);
  auto flags = kept_chains(views, keep);
  if (!flags) return flags.error();
  std::set<std::string> kept;
  std::size_t i = 0;
  for (const auto& [name, chain] : chains)
    if ((*flags)[i++]) kept.insert(name);
  return kept;
}

}  // namespace kvformat
