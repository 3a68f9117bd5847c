// Where the manifests are when --manifests is not given: the anchors folder
// beside the executable (build tree or installed prefix), and the engine
// version read from the tree itself.
#pragma once

#include <string>

#include "error.h"

namespace patcher {

// <exe>/../../anchors (build tree) or <exe>/../share/kvtier/anchors (installed).
Result<std::string> find_anchors_root(const std::string& exe_path);

// Version from <root>/<engine>-*.dist-info/METADATA, else <root>/<engine>/_version.py
// or version.py.
Result<std::string> detect_engine_version(const std::string& root, const std::string& engine);

}  // namespace patcher
