// ROOT when none is given and `overlay` runs from the kvtier wheel: the
// wheel's shim (packaging/wheel/kvtier/_cli.py) searches its interpreter's
// sys.path for the engine distribution and passes the result as JSON in
// KVTIER_PIP_ENV; this picks the tree from it, or says why not.
#pragma once

#include <string>

#include "error.h"

namespace patcher {

struct PipEnv {
  bool present = false;  // KVTIER_PIP_ENV was set (overlay runs from the wheel)
  std::string python;    // the shim's interpreter ("" when not said)
};

// What KVTIER_PIP_ENV says about the interpreter (an unset or unreadable
// value: present=false).
PipEnv read_pip_env(const char* json_text);

struct FoundRoot {
  std::string root;  // the site-packages folder holding the engine
  std::string note;  // one line naming the distribution and the interpreter
};

// The one tree the shim found for `engine`. Errors (exit 2): the shim
// searched another engine or none, no distribution, or several of them.
Result<FoundRoot> root_from_pip_env(const char* json_text, const std::string& engine);

}  // namespace patcher
