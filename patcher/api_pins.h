// Interface pins: anchors/<engine>-<version>/api/<overlay>.toml, written by
// `python3 -m apipins` (apipins/), one [[uses]] table per engine name the
// overlay's injected code and new modules rely on. Parsed here; checked
// against a tree by api_check.h. docs/OVERLAYS.md, "Interface pins".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "error.h"

namespace patcher {

struct ApiUse {
  std::string kind;     // module | name | member | local | abstract
  std::string module;   // module, name, member, abstract: the dotted module
  std::string name;     // name: a module-level name; member/abstract: the class
  std::string member;   // member: the member's name
  std::string is;       // what it was: class, function, value, method, property, attribute, ...
  std::string file;     // local: the engine file (tree-relative)
  std::string scope;    // local: "class X/def f" ("" at module level)
  std::string type;     // member: a name its definition must still mention
  std::string annotation;  // its declared type (a callable: its return type), as written
  bool present = true;  // false: we rely on the engine NOT defining it
  std::vector<std::string> params;    // positional parameters we pass, in order
  std::vector<std::string> keywords;  // keyword arguments we pass
  std::optional<std::vector<std::string>> signature;  // an override: the exact parameters
  std::vector<std::string> methods;   // abstract: the set
  std::vector<std::string> used_by;   // "<overlay source>:<line>"
  int line = 0;                       // the table's line in the pins file

  // "vllm.a.b.C.m" (module, name, member), or "file: scope: name" for a local.
  std::string symbol() const;
};

struct ApiPins {
  std::string file;     // the pins file ("" when the overlay has none)
  std::string overlay;
  std::vector<ApiUse> uses;
};

// Parses one pins file; `overlay` must match its `overlay =`.
Result<ApiPins> parse_api_pins(const std::string& toml_text, const std::string& display_path,
                               const std::string& overlay);

}  // namespace patcher
