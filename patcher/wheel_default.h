// What `overlay` acts on from the kvtier wheel when --overlays is not given.
// The wheel carries no kvtier-cxxscope and no engine C/C++ sources, and an
// overlay that rebuilds an engine binary ([[built_files]]: vllm-fs-durable)
// changes vLLM's own code even with every knob at 0, so the wheel's default
// is the rest of the set; docker/bake.sh leaves the same ones out.
#pragma once

#include <string>
#include <vector>

#include "manifest.h"
#include "state.h"

namespace patcher {

struct DefaultSet {
  std::vector<std::string> overlays;  // stacking order; every overlay when nothing is left out
  std::vector<std::string> left_out;  // "NAME (rebuilds PATH[, PATH])", one per overlay left out
};

// The set without the overlays that rebuild a binary, unless `with_binaries`.
// With `state` (check), such an overlay the tree holds in any state but
// pristine or absent stays in: a check after a full apply still checks it,
// and a half-applied one is still reported.
DefaultSet wheel_default_set(const ManifestSet& set, bool with_binaries, const TreeState* state = nullptr);

}  // namespace patcher
