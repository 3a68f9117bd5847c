// The interface check: every name an overlay's pins (api_pins.h) say its code
// relies on must still exist in the target tree with the same shape: the
// module, the module-level name (re-exports followed), the class member
// (bases followed) and its kind, the parameters we pass, the exact signature
// of a method we override, the abstract methods of a base we implement, the
// locals an injected fragment reads. A name that is gone or changed shape is
// drift, reported with where it was, what is there now (the nearest names)
// and which of our files use it. Read only; injected regions are ignored.
#pragma once

#include <string>
#include <vector>

#include "api_pins.h"
#include "error.h"
#include "paths.h"

namespace patcher {

struct ApiReport {
  std::vector<DriftItem> items;   // one per use the tree does not meet
  std::vector<std::string> lines;  // the same, as the text report
};

Result<ApiReport> check_api(const Tree& tree, const ApiPins& pins);

}  // namespace patcher
