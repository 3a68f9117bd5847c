// What a Python file defines, read line by line without running Python: the
// top-level classes, functions, assignments and imports (also those under a
// top-level `if` or `try`, such as TYPE_CHECKING imports and ImportError
// fallbacks), and a class's members: its body's defs, annotated and assigned
// names, and the `self.<name>` a method assigns. Enough for the interface
// check (api_check.h) to find a name vLLM defines and the shape it has now.
#pragma once

#include <string>
#include <vector>

namespace patcher::py {

enum class DefKind { Class, Function, Value, Import };

struct Def {
  DefKind kind = DefKind::Value;
  std::string name;
  size_t line = 0;  // 0-based first line of the statement (decorators excluded)
  size_t end = 0;   // class/function: end (exclusive) of its block; else the statement's end
  std::vector<std::string> params;      // function: every parameter, self included ("*a", "**kw")
  std::vector<std::string> decorators;  // function/class: "staticmethod", "dataclass(...)", ...
  std::vector<std::string> bases;       // class: base expressions as written
  std::string from;                     // import: the module (absolute), `name` as imported there ("" for a module)
  std::string imported;
  std::string text;  // the statement's text, lines joined (class/function: the header)
  bool annotated = false;  // Value: `name: T` (with or without a value)
  std::string annotation;  // Value: T of `name: T`; Function: its return annotation ("" if none)
};

// An annotation as compared: no spaces, no quotes ("'X | None'" == "X|None").
std::string normal_annotation(const std::string& a);

struct Outline {
  std::vector<std::string> lines;
  std::vector<bool> starts;  // logical line starts
  std::vector<Def> defs;     // top-level, in file order (a later one shadows an earlier one)
};

// `module` is the file's dotted name (for relative imports); `is_package`
// when the file is a package's __init__.py.
Outline outline(const std::string& text, const std::string& module, bool is_package);

// The last top-level definition of `name`, or nullptr.
const Def* find_def(const Outline& o, const std::string& name);

// A class's own members (no bases): body statements, then `self.<name>`
// assignments in its methods (a body definition comes first).
std::vector<Def> members(const Outline& o, const Def& cls);

// Parameters of the function whose `def` starts at line `line`.
std::vector<std::string> params_at(const Outline& o, size_t line);

// Whether `name` is bound inside the function starting at `def_line`: a
// parameter, or the target of an assignment, for, with, except or import.
bool binds(const Outline& o, size_t def_line, const std::string& name);

// Every name `binds` would accept in that function (for nearest-match reports).
std::vector<std::string> bound_names(const Outline& o, size_t def_line);

// True when `word` occurs in `text` as a whole identifier.
bool has_word(const std::string& text, const std::string& word);

}  // namespace patcher::py
