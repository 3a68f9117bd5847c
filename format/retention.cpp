#include "kvtier/format/retention.h"

#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace kvformat {

Result<std::set<std::string>> kept_manifests(
    const std::map<std::string, std::vector<std::string>>& chains, std::uint32_t keep) {
  if (keep > kMaxKeepBoundaries)
    return make_error(Reason::FieldOutOfRange, "keep " + std::to_string(keep));
  std::set<std::string> kept;
  if (keep == 0) {
    for (const auto& [name, chain] : chains) kept.insert(name);
    return kept;
  }
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
  std::map<std::string, std::vector<std::uint32_t>> paths;
  std::unordered_map<std::uint32_t, std::vector<std::string>> names_at;
  for (const auto& [name, chain] : chains) {
    std::uint32_t node = 0;
    std::vector<std::uint32_t> path;
    path.reserve(chain.size());
    for (const auto& key : chain) {
      const auto [it, inserted] =
          nodes.try_emplace(Edge{node, key}, static_cast<std::uint32_t>(nodes.size() + 1));
      node = it->second;
      path.push_back(node);
    }
    names_at[node].push_back(name);
    paths.emplace(name, std::move(path));
  }
  std::unordered_set<std::uint32_t> not_leaf;
  for (const auto& [name, path] : paths)
    for (std::size_t i = 0; i + 1 < path.size(); ++i)
      if (names_at.contains(path[i])) not_leaf.insert(path[i]);
  for (const auto& [name, path] : paths) {
    const std::uint32_t end = path.empty() ? 0 : path.back();
    if (not_leaf.contains(end)) continue;
    kept.insert(name);
    std::uint32_t taken = 0;
    for (std::size_t i = path.size() - (path.empty() ? 0 : 1); i-- > 0 && taken + 1 < keep;) {
      const auto it = names_at.find(path[i]);
      if (it == names_at.end()) continue;
      kept.insert(it->second.begin(), it->second.end());
      ++taken;
    }
  }
  return kept;
}

}  // namespace kvformat
