#include "kvtier/format/retention.h"

#include <algorithm>
#include <random>

#include <gtest/gtest.h>

namespace kvformat {
namespace {

using Chains = std::map<std::string, std::vector<std::string>>;

// FORMAT.md section 6's worked example.
Chains forked() {
  return {{"M1", {"a"}},
          {"M2", {"a", "b"}},
          {"M3", {"a", "b", "c"}},
          {"M4", {"a", "b", "c", "d"}},
          {"M3x", {"a", "b", "x"}},
          {"M4x", {"a", "b", "x", "y"}},
          {"M5x", {"a", "b", "x", "y", "z"}}};
}

std::set<std::string> kept(const Chains& c, std::uint32_t k) { return *kept_manifests(c, k); }

TEST(Retention, WorkedExample) {
  using S = std::set<std::string>;
  EXPECT_EQ(kept(forked(), 1), (S{"M4", "M5x"}));
  EXPECT_EQ(kept(forked(), 2), (S{"M4", "M3", "M5x", "M4x"}));
  EXPECT_EQ(kept(forked(), 3), (S{"M4", "M3", "M2", "M5x", "M4x", "M3x"}));
  EXPECT_EQ(kept(forked(), 5).size(), 7u);
  EXPECT_EQ(kept(forked(), 0).size(), 7u);  // retention off
  EXPECT_FALSE(kept_manifests(forked(), 1025));
}

TEST(Retention, GapsCountOnlyExistingManifests) {
  // [a,b,c] has no manifest: [a,b] is the nearest ancestor of [a,b,c,d,x].
  Chains c{{"G2", {"a", "b"}}, {"G5", {"a", "b", "c", "d", "x"}}, {"other", {"x", "y"}}};
  EXPECT_EQ(kept(c, 2), (std::set<std::string>{"G2", "G5", "other"}));
  EXPECT_EQ(kept(c, 1), (std::set<std::string>{"G5", "other"}));
}

// The definition, computed the slow way: for each leaf, sort its existing
// ancestors by depth and keep K.
std::set<std::string> brute_force(const Chains& chains, std::uint32_t k) {
  auto is_proper_prefix = [](const auto& a, const auto& b) {
    return a.size() < b.size() && std::equal(a.begin(), a.end(), b.begin());
  };
  std::set<std::string> out;
  for (const auto& [name, chain] : chains) {
    bool leaf = true;
    for (const auto& [other, oc] : chains) leaf &= !is_proper_prefix(chain, oc);
    if (!leaf) continue;
    std::vector<std::pair<std::size_t, std::string>> path;
    for (const auto& [other, oc] : chains)
      if (oc == chain || is_proper_prefix(oc, chain)) path.emplace_back(oc.size(), other);
    std::sort(path.rbegin(), path.rend());
    std::size_t depths = 0, last = SIZE_MAX;
    for (const auto& [depth, n] : path) {
      if (depth != last) ++depths, last = depth;
      if (depths > k) break;
      out.insert(n);
    }
  }
  return out;
}

TEST(Retention, MatchesTheDefinitionOnRandomForests) {
  std::mt19937 rng(5);
  for (int round = 0; round < 300; ++round) {
    Chains chains;
    const int n = 1 + static_cast<int>(rng() % 25);
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> chain(1 + rng() % 7);
      for (std::size_t j = 0; j < chain.size(); ++j)
        chain[j] = std::string(1, static_cast<char>('a' + rng() % (j < 3 ? 2 : 5)));
      chains["m" + std::to_string(i)] = chain;
    }
    const std::uint32_t k = 1 + rng() % 4;
    ASSERT_EQ(kept(chains, k), brute_force(chains, k)) << "round " << round;
  }
}

}  // namespace
}  // namespace kvformat
