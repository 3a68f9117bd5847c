#include "kvtier/kvstore/gc_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace kvstore {
namespace {

constexpr int64_t kSec = 1000000000;
constexpr int64_t kNow = 100000 * kSec;

FileStat old_stat(uint64_t size) {
  FileStat s;
  s.size = size;
  s.mtime_ns = kNow - 3600 * kSec;
  return s;
}

ChunkRec chunk(uint32_t group, std::string key, bool state, uint64_t size = 100) {
  ChunkRec c;
  c.group = group;
  c.key = key;
  c.rel = "r/" + key + "_g" + std::to_string(group) + ".bin";
  c.state_group = state;
  c.header_ok = true;
  c.st = old_stat(size);
  return c;
}

// A boundary manifest: the cumulative full chunks of its chain (group 0)
// plus its own state payload (group 1).
ManifestRec manifest(std::string id, std::vector<std::string> chain, std::string state) {
  ManifestRec m;
  m.rel = "r/manifests/" + id + ".json";
  m.name = id + ".json";
  m.chain = chain;
  m.boundary = 64 * chain.size();
  m.parsed = true;
  m.st = old_stat(10);
  for (auto& f : chain) m.refs.push_back({0, f, 100, 0});
  m.refs.push_back({1, state, 100, 0});
  return m;
}

PlanOptions opts(uint32_t keep) {
  PlanOptions o;
  o.keep = keep;
  o.now_ns = kNow;
  o.grace_ns = 600 * kSec;
  return o;
}

std::vector<std::pair<std::string, DeleteReason>> items(const Plan& p) {
  std::vector<std::pair<std::string, DeleteReason>> out;
  for (auto& i : p.items) out.emplace_back(i.rel, i.reason);
  return out;
}

// Linear chain m1..m5; each names f1..fi (group 0) and its state payload si.
RankInventory linear_chain() {
  RankInventory inv;
  inv.name = "p_m_0123456789abcdef_r0";  // ROOT is this rank base: rel is ""
  inv.namespace_ok = true;
  std::vector<std::string> full;
  for (int i = 1; i <= 5; ++i) {
    full.push_back("f" + std::to_string(i));
    inv.chunks.push_back(chunk(0, "f" + std::to_string(i), false));
    inv.chunks.push_back(chunk(1, "s" + std::to_string(i), true));
    inv.manifests.push_back(manifest("m" + std::to_string(i), full, "s" + std::to_string(i)));
  }
  return inv;
}

TEST(KeepSet, LinearChainKeepsTheLastK) {
  auto inv = linear_chain();
  EXPECT_EQ(keep_set(inv.manifests, 2), (std::vector<bool>{false, false, false, true, true}));
  EXPECT_EQ(keep_set(inv.manifests, 0), (std::vector<bool>(5, true)));  // K=0: retention off
  EXPECT_EQ(keep_set(inv.manifests, 9), (std::vector<bool>(5, true)));
}

// FORMAT.md section 6's worked example.
TEST(KeepSet, ForkKeepsSharedAncestors) {
  std::vector<ManifestRec> ms = {
      manifest("M1", {"a"}, "s1"),
      manifest("M2", {"a", "b"}, "s2"),
      manifest("M3", {"a", "b", "c"}, "s3"),
      manifest("M4", {"a", "b", "c", "d"}, "s4"),
      manifest("M3x", {"a", "b", "x"}, "s3x"),
      manifest("M4x", {"a", "b", "x", "y"}, "s4x"),
      manifest("M5x", {"a", "b", "x", "y", "z"}, "s5x"),
  };
  EXPECT_EQ(keep_set(ms, 2), (std::vector<bool>{false, false, true, true, false, true, true}));
  EXPECT_EQ(keep_set(ms, 3), (std::vector<bool>{false, true, true, true, true, true, true}));
  EXPECT_EQ(keep_set(ms, 1), (std::vector<bool>{false, false, false, true, false, false, true}));
}

TEST(KeepSet, BrokenManifestsDoNotCountTowardsK) {
  auto inv = linear_chain();
  inv.manifests[4].broken = true;
  EXPECT_EQ(keep_set(inv.manifests, 2), (std::vector<bool>{false, false, true, true, false}));
}

TEST(Plan, SupersededManifestsAndTheirStatePayloadsOnly) {
  auto p = make_plan(linear_chain(), opts(2));
  using R = DeleteReason;
  EXPECT_EQ(items(p), (std::vector<std::pair<std::string, R>>{
                          {"r/manifests/m1.json", R::kSuperseded},
                          {"r/manifests/m2.json", R::kSuperseded},
                          {"r/manifests/m3.json", R::kSuperseded},
                          {"r/s1_g1.bin", R::kSupersededPayload},
                          {"r/s2_g1.bin", R::kSupersededPayload},
                          {"r/s3_g1.bin", R::kSupersededPayload},
                      }));
  EXPECT_EQ(p.bytes, 3 * 10 + 3 * 100u);
  EXPECT_TRUE(p.refusals.empty());
  EXPECT_EQ(p.manifests_planned, 3u);
}

TEST(Plan, OrphansAndTempsRespectGrace) {
  RankInventory inv;
  inv.namespace_ok = true;
  inv.chunks.push_back(chunk(1, "old_state", true));
  auto fresh = chunk(1, "fresh_state", true);
  fresh.st.mtime_ns = kNow - 5 * kSec;
  inv.chunks.push_back(fresh);
  inv.chunks.push_back(chunk(0, "full_unnamed", false));
  inv.temps.push_back({"r/x.bin.tmp.1.2", old_stat(7)});
  TempRec fresh_tmp{"r/y.bin.tmp.1.2", old_stat(7)};
  fresh_tmp.st.mtime_ns = kNow;
  inv.temps.push_back(fresh_tmp);
  auto locked = opts(2);
  locked.locked = true;
  EXPECT_EQ(make_plan(inv, locked).items.size(), 4u);  // under LOCK_EX every temp is dead
  auto p = make_plan(inv, opts(2));
  using R = DeleteReason;
  EXPECT_EQ(items(p), (std::vector<std::pair<std::string, R>>{
                          {"r/full_unnamed_g0.bin", R::kOrphan},
                          {"r/old_state_g1.bin", R::kOrphan},
                          {"r/x.bin.tmp.1.2", R::kStaleTemp},
                      }));
  EXPECT_TRUE(p.refusals.empty());  // zero manifests: nothing to protect
}

TEST(Plan, BrokenManifestGoesFirstThenItsDamagedChunk) {
  auto inv = linear_chain();
  inv.chunks[9].damaged = true;  // s5
  inv.manifests[4].broken = true;
  auto p = make_plan(inv, opts(2));
  using R = DeleteReason;
  EXPECT_EQ(items(p), (std::vector<std::pair<std::string, R>>{
                          {"r/manifests/m1.json", R::kSuperseded},
                          {"r/manifests/m2.json", R::kSuperseded},
                          {"r/manifests/m5.json", R::kBadManifest},
                          {"r/f5_g0.bin", R::kSupersededPayload},
                          {"r/s1_g1.bin", R::kSupersededPayload},
                          {"r/s2_g1.bin", R::kSupersededPayload},
                          {"r/s5_g1.bin", R::kCorrupt},
                      }));
}

TEST(Plan, NeverPlansAFileAKeptManifestNames) {
  auto inv = linear_chain();
  inv.chunks[9].damaged = true;  // s5, but m5 was not marked broken
  auto p = make_plan(inv, opts(2));
  for (const auto& i : p.items) EXPECT_NE(i.rel, "r/s5_g1.bin");
}

TEST(Plan, RefusesWhenEveryManifestGoes) {
  auto inv = linear_chain();
  inv.chunks[0].damaged = true;  // f1: every manifest names it
  for (auto& m : inv.manifests) m.broken = true;
  auto p = make_plan(inv, opts(2));
  EXPECT_EQ(p.manifests_planned, 5u);
  ASSERT_EQ(p.refusals.size(), 1u);
  EXPECT_EQ(p.refusals[0], "p_m_0123456789abcdef_r0: the plan would delete every manifest (5)");
}

TEST(Plan, RefusesOnUnreadableManifestOrNamespace) {
  auto inv = linear_chain();
  inv.manifests[0].readable = false;
  inv.manifests[0].parsed = false;
  inv.namespace_ok = false;
  inv.findings.push_back({"../p_m_0123456789abcdef_r0.json", FindingKind::kBadNamespace, "namespace record missing"});
  auto p = make_plan(inv, opts(2));
  EXPECT_EQ(p.refusals, (std::vector<std::string>{
                            "r/manifests/m1.json: manifest could not be read",
                            "p_m_0123456789abcdef_r0: rank folder without its namespace record: "
                            "../p_m_0123456789abcdef_r0.json does not exist beside it",
                        }));
  for (const auto& i : p.items) EXPECT_NE(i.rel, "r/manifests/m1.json");
}

// Issue 37: the refusal said "refused .:" for a rank base given as ROOT.
TEST(Plan, InvalidNamespaceRecordIsNamedWithWhatIsWrong) {
  auto inv = linear_chain();
  inv.rel = "p_m_0123456789abcdef_r0";
  inv.namespace_ok = false;
  inv.findings.push_back({"p_m_0123456789abcdef_r0.json", FindingKind::kBadNamespace, "bad_json: not valid JSON"});
  auto p = make_plan(inv, opts(2));
  EXPECT_EQ(p.refusals, (std::vector<std::string>{
                            "p_m_0123456789abcdef_r0: its namespace record p_m_0123456789abcdef_r0.json is "
                            "invalid (bad_json: not valid JSON)",
                        }));
}

// Issue 37: --force on a rank whose manifests were all unparsable deleted
// every chunk (as orphans) and the manifests with them. An unparsable
// manifest hides what it names as an unreadable one does: same rule.
TEST(Plan, UnparsableManifestsHoldEveryChunkBackEvenForced) {
  auto inv = linear_chain();
  inv.chunks.push_back(chunk(0, "orphan", false));
  for (auto& m : inv.manifests) {
    m.parsed = false;
    m.chain.clear();
    m.refs.clear();
  }
  auto p = make_plan(inv, opts(2));
  EXPECT_TRUE(p.chunks_withheld);
  EXPECT_TRUE(p.items.empty()) << p.items.size();
  ASSERT_EQ(p.refusals.size(), 5u);
  EXPECT_EQ(p.refusals[0], "r/manifests/m1.json: manifest could not be parsed");
}

TEST(Plan, OneUnparsableManifestKeepsChunksButSweepsSupersededOnes) {
  auto inv = linear_chain();
  inv.manifests.push_back(manifest("bad", {"f1"}, "s1"));
  inv.manifests.back().parsed = false;
  inv.manifests.back().refs.clear();
  inv.manifests.back().chain.clear();
  inv.chunks.push_back(chunk(0, "orphan", false));
  auto p = make_plan(inv, opts(2));
  EXPECT_TRUE(p.chunks_withheld);
  for (const auto& i : p.items) {
    EXPECT_TRUE(i.manifest) << i.rel;
    EXPECT_EQ(i.reason, DeleteReason::kSuperseded) << i.rel;
  }
  EXPECT_EQ(p.manifests_planned, 3u);  // m1..m3; "bad" itself stays
}

TEST(Plan, PartlyUnreadableRankPlansNoChunkEvenForced) {
  // manifests/ could not be listed: which chunks are named is unknown, so
  // not even --force may delete a chunk (it could be named by an unseen manifest).
  auto inv = linear_chain();
  inv.chunks.push_back(chunk(0, "orphan", false));
  inv.manifests_readable = false;
  inv.findings.push_back({"r/manifests", FindingKind::kUnreadable, "not a readable directory"});
  auto p = make_plan(inv, opts(2));
  EXPECT_TRUE(p.chunks_withheld);
  EXPECT_FALSE(p.refusals.empty());
  for (const auto& i : p.items) EXPECT_TRUE(i.manifest) << i.rel;
  EXPECT_EQ(p.manifests_planned, 3u);  // the superseded readable ones
}

TEST(Plan, LiveWritersPendingChunkIsNeverAnOrphan) {
  auto inv = linear_chain();
  inv.chunks.push_back(chunk(0, "pending", false));
  inv.chunks.back().pending = true;
  inv.chunks.push_back(chunk(0, "orphan", false));
  PendingRec dead;
  dead.rel = "r/pending/7.7.json";
  dead.st = old_stat(40);
  inv.pendings.push_back(dead);
  auto o = opts(0);
  o.grace_ns = 0;
  auto p = make_plan(inv, o);
  auto got = items(p);
  EXPECT_EQ(std::count(got.begin(), got.end(), std::pair<std::string, DeleteReason>{"r/orphan_g0.bin", DeleteReason::kOrphan}), 1);
  EXPECT_EQ(std::count(got.begin(), got.end(), std::pair<std::string, DeleteReason>{"r/pending/7.7.json", DeleteReason::kStaleTemp}), 1);
  for (const auto& i : p.items) EXPECT_NE(i.rel, "r/pending_g0.bin");
}

}  // namespace
}  // namespace kvstore

namespace kvstore {
namespace {

// Three chain trees a, b, c (roots a1, b1, c1), two boundaries each; the
// budget retires the least recently used whole, manifests first.
RankInventory three_trees() {
  RankInventory inv;
  inv.namespace_ok = true;
  for (std::string t : {"a", "b", "c"}) {
    inv.chunks.push_back(chunk(0, t + "1", false));
    inv.chunks.push_back(chunk(0, t + "2", false));
    inv.chunks.push_back(chunk(1, t + "s1", true));
    inv.chunks.push_back(chunk(1, t + "s2", true));
    inv.manifests.push_back(manifest(t + "m1", {t + "1"}, t + "s1"));
    inv.manifests.push_back(manifest(t + "m2", {t + "1", t + "2"}, t + "s2"));
  }
  return inv;  // 12 chunks of 100 bytes, 6 manifests of 10: 1260 bytes
}

void set_recency(RankInventory& inv, const std::string& tree, int64_t age_s) {
  for (auto& m : inv.manifests)
    if (m.chain.front() == tree + "1") m.st.mtime_ns = kNow - age_s * kSec;
}

TEST(GcBudget, RetiresTheLeastRecentlyUsedTreeWhole) {
  auto inv = three_trees();
  set_recency(inv, "a", 100);
  set_recency(inv, "b", 300);  // oldest
  set_recency(inv, "c", 200);
  auto o = opts(0);
  o.max_bytes = 1260 - 1;  // one byte over: one tree goes
  auto p = make_plan(inv, o);
  EXPECT_EQ(p.trees_retired, 1u);
  std::vector<std::string> rels;
  for (auto& i : p.items) {
    EXPECT_EQ(i.reason, DeleteReason::kBudget);
    rels.push_back(i.rel);
  }
  EXPECT_EQ(rels, (std::vector<std::string>{"r/manifests/bm1.json", "r/manifests/bm2.json", "r/b1_g0.bin",
                                            "r/b2_g0.bin", "r/bs1_g1.bin", "r/bs2_g1.bin"}));
  EXPECT_EQ(p.bytes, 420u);
  // Until what is left fits: 1260 - 2 * 420.
  o.max_bytes = 420;
  p = make_plan(inv, o);
  EXPECT_EQ(p.trees_retired, 2u);
  o.max_bytes = 1260;
  EXPECT_EQ(make_plan(inv, o).items.size(), 0u);
}

TEST(GcBudget, NeverATreeNamingAPendingChunkAndTiesGoByRoot) {
  auto inv = three_trees();
  for (auto& c : inv.chunks)
    if (c.key == "a2") c.pending = true;
  auto o = opts(0);
  o.max_bytes = 1000;  // equal recency: a, then b by root; a is pinned
  auto p = make_plan(inv, o);
  EXPECT_EQ(p.trees_retired, 1u);
  EXPECT_EQ(p.items.front().rel, "r/manifests/bm1.json");
}

TEST(GcBudget, SizeParsing) {
  EXPECT_EQ(parse_size("1B"), 1u);
  EXPECT_EQ(parse_size("500G"), 500000000000u);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_size("2KiB"), 2048u);
  EXPECT_EQ(parse_size("0.5MiB"), 524288u);
  for (std::string bad : {"", "0", "1", "500", "-1", "1.5", "1e9", "5 G", "G", "1.G", "12g", "0x10", "99999999999999999999",
                          "9000000000000000000000"})
    EXPECT_FALSE(parse_size(bad)) << bad;
}

// The one size syntax: --max-bytes reads every line of the table the knob
// GLM53_KV_OFFLOAD_DISK_GB is tested against too (its second column).
TEST(GcBudget, SizesTableSharedWithTheKnob) {
  std::ifstream in(std::string(KVTIER_SOURCE_DIR) + "/tests/vectors/sizes.txt");
  ASSERT_TRUE(in) << "tests/vectors/sizes.txt";
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cols;
    std::istringstream words(line);
    for (std::string w; words >> w;) cols.push_back(w);
    ASSERT_GE(cols.size(), 3u) << line;
    std::string text;
    for (size_t i = 0; i + 2 < cols.size(); ++i) text += (i ? " " : "") + cols[i];
    const std::string& want = cols[cols.size() - 2];
    if (want == "-") {
      EXPECT_FALSE(parse_size(text)) << text;
      EXPECT_FALSE(size_problem(text).empty()) << text;
    } else {
      EXPECT_EQ(parse_size(text), std::stoull(want)) << text;
      EXPECT_EQ(size_problem(text), "") << text;
    }
    ++rows;
  }
  EXPECT_GT(rows, 20);
  EXPECT_THAT(size_problem("500"), ::testing::HasSubstr("bare number is ambiguous"));
  EXPECT_THAT(size_problem("500"), ::testing::HasSubstr("500G for GB or 500B for bytes"));
  EXPECT_THAT(size_problem("12g"), ::testing::HasSubstr("case-sensitive"));
}

}  // namespace
}  // namespace kvstore
