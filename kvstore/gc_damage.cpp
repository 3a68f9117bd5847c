// What a sweep left of the damage its scan found: a finding is gone when
// the file it names was deleted by this sweep (a corrupt chunk, a manifest
// that named it). The sweep's exit code rests on it: 0 when nothing damaged
// is left (damage found and removed is a repair, not a failure), 1 when some
// is (docs/KVSTORE.md, "Exit codes").
#include <set>
#include <string>

#include "kvtier/kvstore/gc.h"

namespace kvstore {

namespace {

// The files the sweep deleted: every planned item of a rank it carried out
// without an error, less those it kept after a re-check; a rank that held
// payloads back (a manifest changed since planned) counts only its manifests.
std::set<std::string> deleted_files(const GcReport& r) {
  std::set<std::string> out;
  auto add = [&](const Plan& plan, const std::optional<SweepResult>& swept) {
    if (!swept || !swept->errors.empty()) return;
    std::set<std::string> kept;
    for (const auto& k : swept->skipped) kept.insert(k.rel);
    for (const auto& it : plan.items)
      if (!kept.count(it.rel) && (it.manifest || swept->held == 0)) out.insert(it.rel);
  };
  for (const auto& rank : r.ranks)
    if (rank.executed && !rank.error) add(rank.plan, rank.swept);
  add(r.tier_plan, r.tier_swept);
  return out;
}

}  // namespace

DamageCount damage_after_sweep(const GcReport& r) {
  DamageCount n;
  const std::set<std::string> gone = r.sweep ? deleted_files(r) : std::set<std::string>{};
  for (const auto& f : all_findings(r.scan)) {
    if (!is_damage(f.kind)) continue;
    ++n.found;
    if (gone.count(f.rel)) ++n.removed;
  }
  return n;
}

}  // namespace kvstore
