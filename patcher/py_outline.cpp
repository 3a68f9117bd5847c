#include "py_outline.h"

#include <cctype>

#include "scope.h"
#include "text.h"

namespace patcher::py {

namespace {

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

std::string leading_ident(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && ident_char(s[i])) ++i;
  if (i == 0 || std::isdigit(static_cast<unsigned char>(s[0]))) return "";
  return std::string(s.substr(0, i));
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// A physical line without its comment (a '#' outside a string).
std::string strip_comment(const std::string& l) {
  char quote = 0;
  for (size_t k = 0; k < l.size(); ++k) {
    char c = l[k];
    if (quote) {
      if (c == '\\') ++k;
      else if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      return l.substr(0, k);
    }
  }
  return l;
}

size_t next_start(const Outline& o, size_t i) {
  size_t j = i + 1;
  while (j < o.lines.size() && !o.starts[j]) ++j;
  return j;
}

// The logical line at i: its physical lines, comments dropped, joined by a space.
std::string logical_text(const Outline& o, size_t i) {
  std::string out;
  for (size_t j = i; j < next_start(o, i); ++j) {
    std::string part(trim(strip_comment(o.lines[j])));
    if (part.empty()) continue;
    if (!out.empty()) out += ' ';
    out += part;
  }
  return out;
}

bool is_code(const Outline& o, size_t i) {
  if (!o.starts[i] || is_blank(o.lines[i])) return false;
  return trim(o.lines[i])[0] != '#';
}

size_t indent_of(const std::string& l) { return leading_ws(l).size(); }

// Splits at top-level commas (outside brackets and strings).
std::vector<std::string> split_top(std::string_view s) {
  std::vector<std::string> out;
  int depth = 0;
  char quote = 0;
  size_t from = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    char c = s[k];
    if (quote) {
      if (c == '\\') ++k;
      else if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') quote = c;
    else if (c == '(' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == ']' || c == '}') --depth;
    else if (c == ',' && depth == 0) {
      out.emplace_back(trim(s.substr(from, k - from)));
      from = k + 1;
    }
  }
  std::string last(trim(s.substr(from)));
  if (!last.empty()) out.push_back(last);
  return out;
}

// The text inside the bracket that opens at `open`, or "" when unbalanced.
std::string bracketed(const std::string& s, size_t open) {
  int depth = 0;
  char quote = 0;
  for (size_t k = open; k < s.size(); ++k) {
    char c = s[k];
    if (quote) {
      if (c == '\\') ++k;
      else if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') quote = c;
    else if (c == '(' || c == '[' || c == '{') ++depth;
    else if ((c == ')' || c == ']' || c == '}') && --depth == 0) return s.substr(open + 1, k - open - 1);
  }
  return "";
}

std::vector<std::string> parse_params(const std::string& header) {
  size_t open = header.find('(');
  std::vector<std::string> out;
  if (open == std::string::npos) return out;
  for (const auto& item : split_top(bracketed(header, open))) {
    std::string_view p = item;
    std::string prefix;
    if (starts_with(p, "**")) prefix = "**", p.remove_prefix(2);
    else if (starts_with(p, "*")) prefix = "*", p.remove_prefix(1);
    p = trim(p);
    std::string name = leading_ident(p);
    if (name.empty()) continue;  // a bare `*` or `/`
    out.push_back(prefix + name);
  }
  return out;
}

std::string resolve_relative(const std::string& module, bool is_package, const std::string& target) {
  size_t dots = 0;
  while (dots < target.size() && target[dots] == '.') ++dots;
  if (dots == 0) return target;
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t k = 0; k <= module.size(); ++k)
    if (k == module.size() || module[k] == '.') {
      parts.push_back(module.substr(from, k - from));
      from = k + 1;
    }
  if (!is_package && !parts.empty()) parts.pop_back();
  for (size_t d = 1; d < dots && !parts.empty(); ++d) parts.pop_back();
  std::string base;
  for (auto& p : parts) base += (base.empty() ? "" : ".") + p;
  std::string rest = target.substr(dots);
  if (rest.empty()) return base;
  return base.empty() ? rest : base + "." + rest;
}

void parse_import(const std::string& text, const std::string& module, bool is_package, size_t line, size_t end,
                  std::vector<Def>& out) {
  if (starts_with(text, "import ")) {
    for (const auto& item : split_top(text.substr(7))) {
      size_t as = item.find(" as ");
      Def d;
      d.kind = DefKind::Import;
      d.line = line;
      d.end = end;
      d.text = text;
      if (as != std::string::npos) {
        d.name = std::string(trim(item.substr(as + 4)));
        d.from = std::string(trim(item.substr(0, as)));
      } else {
        d.from = item.substr(0, item.find('.'));
        d.name = d.from;
      }
      out.push_back(d);
    }
    return;
  }
  size_t imp = text.find(" import ");
  if (imp == std::string::npos) return;
  std::string from = resolve_relative(module, is_package, std::string(trim(text.substr(5, imp - 5))));
  std::string names(trim(text.substr(imp + 8)));
  if (!names.empty() && names.front() == '(') names = bracketed(names, 0);
  for (const auto& item : split_top(names)) {
    if (item == "*") continue;
    size_t as = item.find(" as ");
    Def d;
    d.kind = DefKind::Import;
    d.line = line;
    d.end = end;
    d.text = text;
    d.from = from;
    d.imported = std::string(trim(item.substr(0, as)));
    d.name = as == std::string::npos ? d.imported : std::string(trim(item.substr(as + 4)));
    out.push_back(d);
  }
}

// The targets an assignment statement binds ("a, b = ...", "x: T = ...").
std::vector<std::string> assigned_names(const std::string& text, bool* annotated) {
  *annotated = false;
  std::string first = leading_ident(text);
  if (!first.empty()) {
    std::string_view rest = trim(std::string_view(text).substr(first.size()));
    if (starts_with(rest, ":") && !starts_with(rest, ":=")) {
      *annotated = true;
      return {first};
    }
  }
  // LHS up to the first top-level '=' that is not part of ==, <=, >=, !=, :=
  int depth = 0;
  for (size_t k = 0; k < text.size(); ++k) {
    char c = text[k];
    if (c == '(' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == ']' || c == '}') --depth;
    else if (c == '"' || c == '\'') return {};
    else if (c == '=' && depth == 0) {
      char prev = k ? text[k - 1] : ' ', next = k + 1 < text.size() ? text[k + 1] : ' ';
      if (next == '=' || prev == '=' || prev == '<' || prev == '>' || prev == '!' || prev == ':' || prev == '+' ||
          prev == '-' || prev == '*' || prev == '/' || prev == '%' || prev == '&' || prev == '|' || prev == '^')
        return {};
      std::vector<std::string> out;
      std::string lhs = text.substr(0, k);
      for (char& ch : lhs)
        if (ch == '(' || ch == ')' || ch == '[' || ch == ']') ch = ' ';
      for (const auto& t : split_top(lhs)) {
        std::string_view v = trim(t);
        if (starts_with(v, "*")) v.remove_prefix(1);
        std::string n = leading_ident(v);
        if (!n.empty() && n.size() == v.size()) out.push_back(n);
      }
      return out;
    }
  }
  return {};
}

// `T` of "<target>: T = value" (text starts at the ':'), up to a top-level '='.
std::string annotation_after(std::string_view rest) {
  rest.remove_prefix(1);  // the ':'
  int depth = 0;
  for (size_t k = 0; k < rest.size(); ++k) {
    char c = rest[k];
    if (c == '(' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == ']' || c == '}') --depth;
    else if (c == '=' && depth == 0 && (k + 1 >= rest.size() || rest[k + 1] != '='))
      return std::string(trim(rest.substr(0, k)));
  }
  return std::string(trim(rest));
}

// The return annotation of a def header ("def f(...) -> T:").
std::string return_annotation(const std::string& header) {
  size_t open = header.find('(');
  if (open == std::string::npos) return "";
  std::string inner = bracketed(header, open);
  size_t after = header.find(inner, open) + inner.size() + 1;  // past the ')'
  size_t arrow = header.find("->", after);
  if (arrow == std::string::npos) return "";
  size_t colon = header.rfind(':');
  if (colon == std::string::npos || colon < arrow) return "";
  return std::string(trim(std::string_view(header).substr(arrow + 2, colon - arrow - 2)));
}

const char* kKeywords[] = {"if",   "elif",   "else",   "try",    "except", "finally", "for",  "while", "with",
                           "return", "raise", "assert", "del", "pass", "break", "continue", "global",
                           "nonlocal", "yield", "await", "match", "case", "lambda", "async"};

bool is_keyword_statement(const std::string& text) {
  std::string w = leading_ident(text);
  for (const char* k : kKeywords)
    if (w == k) return true;
  return false;
}

// Statements at `indent` in [begin, end); `top` recurses into if/try blocks.
void scan(const Outline& o, size_t begin, size_t end, const std::string& module, bool is_package, bool top,
          std::vector<Def>& out) {
  std::vector<std::string> decorators;
  size_t want = std::string::npos;
  for (size_t i = begin; i < end;) {
    if (!is_code(o, i)) {
      ++i;
      continue;
    }
    size_t ind = indent_of(o.lines[i]);
    if (want == std::string::npos) want = ind;
    size_t stop = next_start(o, i);
    if (ind != want) {
      i = stop;
      continue;
    }
    std::string text = logical_text(o, i);
    if (text[0] == '@') {
      decorators.push_back(text.substr(1));
      i = stop;
      continue;
    }
    bool async_def = starts_with(text, "async def ");
    if (starts_with(text, "class ") || starts_with(text, "def ") || async_def) {
      Def d;
      d.kind = text[0] == 'c' ? DefKind::Class : DefKind::Function;
      std::string_view rest = std::string_view(text).substr(async_def ? 10 : d.kind == DefKind::Class ? 6 : 4);
      d.name = leading_ident(trim(rest));
      d.line = i;
      d.end = block_end(o.lines, o.starts, i);
      d.text = text;
      d.decorators = std::move(decorators);
      decorators.clear();
      if (d.kind == DefKind::Function) {
        d.params = parse_params(text);
        d.annotation = return_annotation(text);
      } else {
        size_t open = text.find('(');
        size_t colon = text.find(':');
        if (open != std::string::npos && open < colon) d.bases = split_top(bracketed(text, open));
      }
      out.push_back(std::move(d));
      i = out.back().end;
      continue;
    }
    decorators.clear();
    if (starts_with(text, "import ") || starts_with(text, "from ")) {
      parse_import(text, module, is_package, i, stop, out);
      i = stop;
      continue;
    }
    std::string w = leading_ident(text);
    if (top && (w == "if" || w == "elif" || w == "else" || w == "try" || w == "except" || w == "finally")) {
      size_t body_end = block_end(o.lines, o.starts, i);
      scan(o, stop, body_end, module, is_package, top, out);
      i = body_end;
      continue;
    }
    if (!is_keyword_statement(text)) {
      bool annotated = false;
      for (const auto& n : assigned_names(text, &annotated)) {
        Def d;
        d.kind = DefKind::Value;
        d.name = n;
        d.line = i;
        d.end = stop;
        d.text = text;
        d.annotated = annotated;
        if (annotated) d.annotation = annotation_after(std::string_view(text).substr(text.find(':')));
        out.push_back(std::move(d));
      }
    }
    i = block_end(o.lines, o.starts, i) > stop ? block_end(o.lines, o.starts, i) : stop;
  }
}

// `self.<name>` targets of an assignment statement's text.
std::vector<std::pair<std::string, bool>> self_targets(const std::string& text) {
  std::vector<std::pair<std::string, bool>> out;
  if (!starts_with(text, "self.")) return out;
  std::string name = leading_ident(std::string_view(text).substr(5));
  std::string_view rest = trim(std::string_view(text).substr(5 + name.size()));
  if (starts_with(rest, ":") && !starts_with(rest, ":=")) return {{name, true}};
  // "self.a, self.b = ..." and "self.a = ...": every self.<x> left of '='
  int depth = 0;
  for (size_t k = 0; k < text.size(); ++k) {
    char c = text[k];
    if (c == '(' || c == '[' || c == '{') ++depth;
    else if (c == ')' || c == ']' || c == '}') --depth;
    else if (c == '=' && depth == 0) {
      char prev = k ? text[k - 1] : ' ', next = k + 1 < text.size() ? text[k + 1] : ' ';
      if (next == '=' || std::string("=<>!:+-*/%&|^").find(prev) != std::string::npos) return out;
      for (const auto& t : split_top(text.substr(0, k))) {
        std::string_view v = trim(t);
        if (!starts_with(v, "self.")) continue;
        std::string n = leading_ident(v.substr(5));
        if (n.size() + 5 == v.size()) out.emplace_back(n, false);
      }
      return out;
    }
  }
  return out;
}

}  // namespace

std::string normal_annotation(const std::string& a) {
  std::string out;
  for (char c : a)
    if (!std::isspace(static_cast<unsigned char>(c)) && c != '"' && c != '\'') out += c;
  return out;
}

bool has_word(const std::string& text, const std::string& word) {
  if (word.empty()) return false;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    bool left = at == 0 || !ident_char(text[at - 1]);
    bool right = at + word.size() >= text.size() || !ident_char(text[at + word.size()]);
    if (left && right) return true;
  }
  return false;
}

Outline outline(const std::string& text, const std::string& module, bool is_package) {
  Outline o;
  o.lines = split_lines(text).lines;
  o.starts = logical_starts(o.lines);
  scan(o, 0, o.lines.size(), module, is_package, true, o.defs);
  return o;
}

const Def* find_def(const Outline& o, const std::string& name) {
  const Def* found = nullptr;
  for (const auto& d : o.defs)
    if (d.name == name) found = &d;
  return found;
}

std::vector<Def> members(const Outline& o, const Def& cls) {
  std::vector<Def> out;
  size_t body = next_start(o, cls.line);
  scan(o, body, cls.end, "", false, false, out);
  std::vector<Def> methods;
  for (const auto& d : out)
    if (d.kind == DefKind::Function) methods.push_back(d);
  for (const auto& m : methods) {
    for (size_t i = next_start(o, m.line); i < m.end; i = next_start(o, i)) {
      if (!is_code(o, i)) continue;
      std::string text = logical_text(o, i);
      for (const auto& [name, annotated] : self_targets(text)) {
        Def d;
        d.kind = DefKind::Value;
        d.name = name;
        d.line = i;
        d.end = next_start(o, i);
        d.text = text + "  # in " + m.text;  // the method's signature types its parameters
        d.annotated = annotated;
        if (annotated) d.annotation = annotation_after(std::string_view(text).substr(text.find(':')));
        out.push_back(std::move(d));
      }
    }
  }
  return out;
}

std::vector<std::string> params_at(const Outline& o, size_t line) {
  return parse_params(logical_text(o, line));
}

std::vector<std::string> bound_names(const Outline& o, size_t def_line) {
  std::vector<std::string> out;
  for (auto p : params_at(o, def_line)) {
    while (!p.empty() && p[0] == '*') p.erase(0, 1);
    out.push_back(p);
  }
  size_t end = block_end(o.lines, o.starts, def_line);
  for (size_t i = next_start(o, def_line); i < end; i = next_start(o, i)) {
    if (!is_code(o, i)) continue;
    std::string text = logical_text(o, i);
    bool ann = false;
    std::string w = leading_ident(text);
    if (w == "for" || w == "async") {
      size_t in = text.find(" in ");
      std::string targets = text.substr(text.find("for ") + 4, in == std::string::npos ? 0 : in - text.find("for ") - 4);
      for (char& c : targets)
        if (c == '(' || c == ')' || c == '[' || c == ']') c = ' ';
      for (const auto& t : split_top(targets)) out.emplace_back(trim(t));
    } else if (w == "with" || w == "except") {
      for (size_t at = text.find(" as "); at != std::string::npos; at = text.find(" as ", at + 1))
        out.push_back(leading_ident(std::string_view(text).substr(at + 4)));
    } else if (starts_with(text, "import ") || starts_with(text, "from ")) {
      std::vector<Def> imports;
      parse_import(text, "", false, i, i, imports);
      for (const auto& d : imports) out.push_back(d.name);
    } else if (!is_keyword_statement(text)) {
      for (const auto& n : assigned_names(text, &ann)) out.push_back(n);
    }
    for (size_t at = text.find(":="); at != std::string::npos; at = text.find(":=", at + 2)) {
      size_t b = at;
      while (b > 0 && (text[b - 1] == ' ')) --b;
      size_t a = b;
      while (a > 0 && ident_char(text[a - 1])) --a;
      out.push_back(text.substr(a, b - a));
    }
  }
  return out;
}

bool binds(const Outline& o, size_t def_line, const std::string& name) {
  for (const auto& n : bound_names(o, def_line))
    if (n == name) return true;
  return false;
}

}  // namespace patcher::py
