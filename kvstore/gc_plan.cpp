#include "kvtier/kvstore/gc_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "kvtier/format/layout.h"
#include "kvtier/format/retention.h"

namespace kvstore {

const char* reason_name(DeleteReason r) {
  switch (r) {
    case DeleteReason::kStaleTemp: return "stale-temp";
    case DeleteReason::kOrphan: return "orphan";
    case DeleteReason::kCorrupt: return "corrupt";
    case DeleteReason::kBadManifest: return "bad-manifest";
    case DeleteReason::kSuperseded: return "superseded";
    case DeleteReason::kSupersededPayload: return "superseded-payload";
    case DeleteReason::kBudget: return "budget";
  }
  return "?";
}

std::vector<bool> keep_set(const std::vector<ManifestRec>& ms, uint32_t keep) {
  // The chains are viewed where the scan left them, not copied.
  std::vector<std::span<const std::string>> chains;
  std::vector<size_t> which;
  for (size_t i = 0; i < ms.size(); ++i)
    if (ms[i].parsed && !ms[i].broken) {
      chains.emplace_back(ms[i].chain);
      which.push_back(i);
    }
  std::vector<bool> kept(ms.size(), false);
  auto flags = kvformat::kept_chains(chains, keep);
  // An out-of-range K keeps everything: deleting nothing is the safe failure.
  for (size_t k = 0; k < which.size(); ++k) kept[which[k]] = !flags || (*flags)[k];
  return kept;
}

namespace {

std::string ref_key(uint32_t group, const std::string& key) {
  return fmt::format("{}/{}", group, key);
}

// Names the rank folder, the record it lacks and what is wrong with it
// (the scan's finding on the record, FORMAT.md 4: <rank base>.json beside it).
std::string namespace_refusal(const RankInventory& inv, const std::string& where) {
  const std::string record = kvformat::namespace_record_name(inv.name);
  for (const auto& f : inv.findings) {
    const bool on_record = f.rel == record || f.rel.ends_with("/" + record);
    if (!on_record || (f.kind != FindingKind::kBadNamespace && f.kind != FindingKind::kUnreadable)) continue;
    if (f.detail == "namespace record missing")
      return fmt::format("{}: rank folder without its namespace record: {} does not exist beside it", where, f.rel);
    return fmt::format("{}: its namespace record {} is invalid ({})", where, f.rel, f.detail);
  }
  return fmt::format("{}: no valid namespace record {} beside the rank folder", where, record);
}

bool older_than_grace(const FileStat& st, const PlanOptions& opt) {
  return st.mtime_ns + opt.grace_ns <= opt.now_ns;
}

}  // namespace

Plan make_plan(const RankInventory& inv, const PlanOptions& opt) {
  Plan plan;
  std::vector<PlanItem> manifests, rest;
  plan.manifests_total = inv.manifests.size();

  auto kept = keep_set(inv.manifests, opt.keep);
  // Per chunk: named by some manifest, named by a kept one. The scan resolved
  // refs to chunk indexes; synthetic inventories are matched by group/key.
  std::vector<char> named_by_any(inv.chunks.size(), 0), named_by_kept(inv.chunks.size(), 0);
  std::unordered_map<std::string, size_t> by_key;
  auto resolve = [&](const ManifestRef& r) -> long {
    if (r.chunk != ManifestRef::kUnresolved) return r.chunk;
    if (by_key.empty())
      for (size_t i = 0; i < inv.chunks.size(); ++i) by_key.emplace(ref_key(inv.chunks[i].group, inv.chunks[i].key), i);
    auto it = by_key.find(ref_key(r.group, r.key));
    return it == by_key.end() ? ManifestRef::kNoChunk : static_cast<long>(it->second);
  };
  for (size_t i = 0; i < inv.manifests.size(); ++i) {
    for (const auto& r : inv.manifests[i].refs) {
      long c = resolve(r);
      if (c < 0 || static_cast<size_t>(c) >= inv.chunks.size()) continue;
      named_by_any[c] = 1;
      if (kept[i]) named_by_kept[c] = 1;
    }
  }

  // Something in the rank could not be read or parsed (a manifest, manifests/
  // itself, a chunk folder, a live writer's pending record): nobody can say
  // which chunks are unnamed or whether a "missing" chunk is really gone. An
  // unparsable manifest (torn, bit rot, a later format version) hides what
  // it names exactly as an unreadable one does. Even --force then deletes
  // only what cannot break a manifest: superseded readable manifests and
  // temps; the unparsable manifest stays, so the next sweep cannot take its
  // chunks for orphans either.
  bool complete = inv.manifests_readable;
  for (const auto& m : inv.manifests) complete = complete && m.readable && m.parsed;
  for (const auto& f : inv.findings)
    if (f.kind == FindingKind::kUnreadable || f.kind == FindingKind::kBadPending) complete = false;

  for (size_t i = 0; i < inv.manifests.size(); ++i) {
    const auto& m = inv.manifests[i];
    if (!m.readable || !m.parsed) {
      plan.refusals.push_back(
          fmt::format("{}: manifest could not be {}", m.rel, m.readable ? "parsed" : "read"));
      continue;  // never deleted, not even forced: what it names is unknown
    }
    if (m.broken) {
      // Incomplete: its "missing" chunk may only be unseen.
      if (complete)
        manifests.push_back({m.rel, DeleteReason::kBadManifest, "names a missing or damaged chunk", m.st, true});
    } else if (!kept[i]) {
      manifests.push_back({m.rel, DeleteReason::kSuperseded,
                           fmt::format("beyond keep {} on every chain", opt.keep), m.st, true});
    }
  }

  for (size_t ci = 0; complete && ci < inv.chunks.size(); ++ci) {
    const auto& c = inv.chunks[ci];
    if (named_by_kept[ci]) continue;  // never plan what a kept manifest names
    if (c.pending && !c.damaged) continue;  // a live writer will name it (FORMAT.md 9.1)
    if (c.damaged) {
      rest.push_back({c.rel, DeleteReason::kCorrupt, "damaged chunk", c.st, false});
    } else if (named_by_any[ci]) {
      // Named, but only by manifests this plan deletes. Under leaf-walk keep-K
      // only state payloads get here (kept manifests name their whole
      // cumulative prefix), except chunks named only by broken manifests.
      rest.push_back({c.rel, DeleteReason::kSupersededPayload,
                      "named only by manifests this plan deletes", c.st, false});
    } else if (older_than_grace(c.st, opt)) {
      rest.push_back({c.rel, DeleteReason::kOrphan, "named by no manifest", c.st, false});
    }
  }
  for (const auto& t : inv.temps)
    if (opt.locked || older_than_grace(t.st, opt))
      rest.push_back({t.rel, DeleteReason::kStaleTemp,
                      opt.locked ? "writer temp, no writer active" : "older than the grace period",
                      t.st, false});

  for (const auto& p : inv.pendings)
    if (!p.live)
      rest.push_back({p.rel, DeleteReason::kStaleTemp, "pending record of a writer that has exited", p.st, false});

  if (opt.max_bytes && complete) {
    // The budget counts what stays after the rules above (FORMAT.md 8.1).
    uint64_t planned = 0;
    std::vector<bool> planned_manifest(inv.manifests.size(), false);
    std::unordered_map<std::string, size_t> by_rel_index;
    for (size_t i = 0; i < inv.manifests.size(); ++i) by_rel_index.emplace(inv.manifests[i].rel, i);
    for (const auto& it : manifests) {
      planned += it.st.size;
      if (auto f = by_rel_index.find(it.rel); f != by_rel_index.end()) planned_manifest[f->second] = true;
    }
    for (const auto& it : rest) planned += it.st.size;
    plan.trees_retired = plan_budget(inv, opt, planned, planned_manifest, manifests, rest);
  } else if (opt.max_bytes) {
    plan.refusals.push_back(fmt::format("{}: --max-bytes not planned: part of the rank could not be read",
                                        inv.rel.empty() ? inv.name : inv.rel));
  }

  auto by_rel = [](const PlanItem& a, const PlanItem& b) { return a.rel < b.rel; };
  std::sort(manifests.begin(), manifests.end(), by_rel);
  std::sort(rest.begin(), rest.end(), by_rel);
  plan.manifests_planned = manifests.size();
  // The rank by its folder's name, also when it is ROOT itself (its rel is "").
  const std::string& where = inv.rel.empty() ? inv.name : inv.rel;
  if (plan.manifests_total > 0 && plan.manifests_planned == plan.manifests_total)
    plan.refusals.push_back(
        fmt::format("{}: the plan would delete every manifest ({})", where, plan.manifests_total));
  if (!inv.namespace_ok) plan.refusals.push_back(namespace_refusal(inv, where));
  for (const auto& f : inv.findings) {
    if (f.kind == FindingKind::kUnreadable)
      plan.refusals.push_back(fmt::format("{}: could not be read ({})", f.rel, f.detail));
    if (f.kind == FindingKind::kBadPending)
      plan.refusals.push_back(fmt::format("{}: a live writer's pending record is unreadable ({})", f.rel, f.detail));
    if (f.kind == FindingKind::kUnsafeFolder) {
      plan.refusals.push_back(fmt::format("{}: store folder not safe: {}", f.rel, f.detail));
      plan.unsafe = true;
    }
  }
  plan.chunks_withheld = !complete;

  for (auto& it : manifests) {
    plan.bytes += it.st.size;
    plan.items.push_back(std::move(it));
  }
  for (auto& it : rest) {
    plan.bytes += it.st.size;
    plan.items.push_back(std::move(it));
  }
  return plan;
}

void merge_plan(Plan& into, Plan&& more) {
  // Keep the global "manifests first" order: a merged plan is swept per rank anyway.
  for (auto& it : more.items) into.items.push_back(std::move(it));
  into.bytes += more.bytes;
  into.manifests_total += more.manifests_total;
  into.manifests_planned += more.manifests_planned;
  for (auto& r : more.refusals) into.refusals.push_back(std::move(r));
  into.chunks_withheld = into.chunks_withheld || more.chunks_withheld;
  into.unsafe = into.unsafe || more.unsafe;
  into.trees_retired += more.trees_retired;
}

}  // namespace kvstore
