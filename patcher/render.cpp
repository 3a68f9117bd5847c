#include "render.h"

#include "diff.h"
#include "fmt/format.h"
#include "text.h"

namespace patcher {

namespace {

// What to do about an overlay in a state apply and revert refuse ("" for a
// clean one): status reports, check judges; neither leaves the reader
// without a way out (docs/UPGRADING.md has the longer story).
std::string next_step(OverlayStatus s) {
  switch (s) {
    case OverlayStatus::Tampered:
      return "a file the overlay owns was edited; put it back as the overlay left it, or reinstall the engine "
             "(pip install --force-reinstall --no-deps vllm==<its release>), then `overlay revert --new-files-only` "
             "and `overlay apply` (apply and revert refuse a tampered tree)";
    case OverlayStatus::HalfApplied:
      return "some files carry the overlay and some do not (an engine reinstalled or upgraded under it?); reinstall "
             "the engine, then `overlay revert --new-files-only`, then `overlay apply`";
    case OverlayStatus::Stale:
      return "the overlay changed since it was applied: `overlay revert`, then `overlay apply`";
    case OverlayStatus::Drift:
      return "the engine's files are not the pinned release's (upgraded or edited): see docs/UPGRADING.md; "
             "`overlay revert --new-files-only` removes what the overlays added";
    default: return "";
  }
}

}  // namespace

nlohmann::json state_json(const TreeState& ts) {
  nlohmann::json j;
  j["journal"] = ts.journal;
  j["stray_temps"] = ts.stray_temps;
  j["journal_problems"] = ts.journal_problems;
  j["leftovers"] = nlohmann::json::array();
  for (const auto& l : ts.leftovers) j["leftovers"].push_back({{"path", l.path}, {"what", l.what}, {"fate", l.fate}});
  j["strays"] = nlohmann::json::array();
  for (const auto& l : ts.strays) j["strays"].push_back({{"path", l.path}, {"what", l.what}, {"fate", l.fate}});
  j["overlays"] = nlohmann::json::array();
  for (const auto& o : ts.overlays)
    j["overlays"].push_back({{"name", o.name},
                             {"state", overlay_status_name(o.state)},
                             {"summary", o.summary},
                             {"after", o.after},
                             {"problems", o.problems},
                             {"superseded", o.superseded}});
  j["files"] = nlohmann::json::array();
  for (const auto& f : ts.files) {
    nlohmann::json fj = {{"path", f.path}, {"new_file", f.is_new}, {"state", file_status_name(f.state)},
                         {"message", f.message}, {"details", f.details}, {"pin", f.pin}, {"sha256", f.sha}};
    fj["drift"] = nlohmann::json::array();
    for (const auto& d : f.drift) fj["drift"].push_back(drift_json(d));
    fj["overlays"] = nlohmann::json::array();
    for (const auto& fo : f.overlays) {
      nlohmann::json oj = {{"overlay", fo.overlay}, {"state", file_overlay_status_name(fo.state)}};
      oj["edits"] = nlohmann::json::array();
      for (const auto& e : fo.edits)
        oj["edits"].push_back({{"id", e.id}, {"state", edit_status_name(e.state)}, {"present", e.present}, {"expected", e.expected}});
      fj["overlays"].push_back(oj);
    }
    j["files"].push_back(fj);
  }
  return j;
}

nlohmann::json report_json(const std::string& command, const OverlayReport& o) {
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& c : o.changes) changes.push_back({{"path", c.path}, {"action", c.action}, {"notes", c.notes}});
  return {{"ok", true},           {"command", command},       {"selected", o.selected},
          {"skipped", o.skipped}, {"absent", o.absent}, {"recovered", o.recovered}, {"compiled", o.compiled},
          {"notes", o.notes},     {"changes", changes},       {"state", state_json(o.state)}};
}

std::string escape_controls(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out;
}

nlohmann::json drift_json(const DriftItem& d) {
  nlohmann::json j = {{"kind", d.kind}, {"manifest", d.manifest}};
  if (!d.overlay.empty()) {
    j["overlay"] = d.overlay;
    j["edit"] = d.edit;
    j["scope"] = d.scope;
    j["expected"] = d.expected;
    j["found"] = d.found;
    j["found_at"] = d.found_at;
  }
  j["nearest"] = nlohmann::json::array();
  for (const auto& n : d.nearest) {
    nlohmann::json nj = {{"line", n.line}, {"score", n.score}, {"text", n.text}};
    if (!n.injected_by.empty()) {
      nj["injected_by"] = n.injected_by;
      nj["region_line"] = n.region_line;
    }
    j["nearest"].push_back(nj);
  }
  j["diff"] = d.diff;
  if (!d.superseded_by.empty()) j["superseded_by"] = d.superseded_by;
  if (!d.elsewhere.empty()) j["anchor_elsewhere"] = d.elsewhere;
  if (!d.pin_line.empty()) j["pin_line"] = d.pin_line;
  if (d.kind == "api") {
    j["overlay"] = d.overlay;
    j["symbol"] = d.symbol;
    j["problem"] = d.problem;
    j["now"] = d.now;
    j["used_by"] = d.used_by;
  }
  return j;
}

nlohmann::json error_json(const Error& e) {
  nlohmann::json err = {{"code", static_cast<int>(e.kind)},
                        {"kind", kind_name(e.kind)},
                        {"file", e.file},
                        {"message", e.message},
                        {"line", e.line()}};
  if (e.drift.empty()) {
    err["details"] = e.details;
  } else {
    // Structured: one entry per file, each with its edits.
    nlohmann::json files = nlohmann::json::array();
    for (const auto& d : e.drift) {
      nlohmann::json* slot = nullptr;
      for (auto& f : files)
        if (f["file"] == d.file) slot = &f;
      if (!slot) {
        files.push_back({{"file", d.file}, {"edits", nlohmann::json::array()}});
        slot = &files.back();
      }
      (*slot)["edits"].push_back(drift_json(d));
    }
    err["files"] = files;
  }
  return {{"ok", false}, {"error", err}};
}

std::string state_text(const TreeState& ts) {
  std::string out;
  for (const auto& o : ts.overlays) {
    out += fmt::format("overlay {}: {}", o.name, overlay_status_name(o.state));
    if (!o.summary.empty()) out += "  (" + o.summary + ")";
    out += "\n";
    for (const auto& p : o.problems) out += "  problem: " + p + "\n";
    for (const auto& s : o.superseded) out += "  superseded upstream: " + s + "\n";
    if (std::string next = next_step(o.state); !next.empty()) out += "  next: " + next + "\n";
  }
  for (const auto& f : ts.files) {
    out += fmt::format("{} {}: {}", f.is_new ? "new file" : "file", f.path, file_status_name(f.state));
    if (!f.message.empty()) out += " - " + f.message;
    out += "\n";
    for (const auto& fo : f.overlays) {
      if (f.is_new) continue;
      std::string edits;
      for (const auto& e : fo.edits) edits += (edits.empty() ? "" : ", ") + e.id + " " + edit_status_name(e.state);
      out += fmt::format("  {}: {} ({})\n", fo.overlay, file_overlay_status_name(fo.state), edits);
    }
    for (const auto& d : f.details) out += "  " + d + "\n";
  }
  for (const auto& l : ts.leftovers) out += "leftover " + l.what + " " + l.path + ": " + l.fate + "\n";
  for (const auto& l : ts.strays) out += l.what + " " + l.path + ": " + l.fate + "\n";
  for (const auto& p : ts.journal_problems) out += "  problem: " + p + "\n";
  return out;
}

std::string report_text(const std::string& command, const OverlayReport& o, bool with_diff) {
  std::string out;
  if (o.recovered) out += "completed an interrupted transaction first\n";
  for (const auto& s : o.skipped)
    out += fmt::format("{}: already {}\n", s, command == "revert" || command == "plan-revert" ? "pristine" : "applied");
  for (const auto& s : o.absent)
    out += fmt::format("{}: absent: neither its C/C++ sources nor the binary built from them is in this tree; "
                       "nothing to do\n",
                       s);
  bool dry = command.rfind("plan", 0) == 0;
  for (const auto& c : o.changes) {
    out += fmt::format("{} {} {}\n", dry ? "would" : "did", c.action, c.path);
    for (const auto& n : c.notes) out += "  " + n + "\n";
    if (with_diff)
      for (const auto& l : unified_file_diff(split_lines(c.old_text).lines, split_lines(c.new_text).lines,
                                             "a/" + c.path, "b/" + c.path))
        out += l + "\n";
  }
  if (o.compiled) out += fmt::format("compiled {} files and fragments: ok\n", o.compiled);
  for (const auto& n : o.notes) out += "note: " + n + "\n";
  if (o.changes.empty()) out += "nothing to do\n";
  return out;
}

nlohmann::json recover_json(const RecoverReport& r) {
  nlohmann::json j;
  j["ok"] = true;
  j["command"] = r.discarded ? "recover-discard" : "recover";
  j["had_journal"] = r.had_journal;
  j["found"] = nlohmann::json::array();
  for (const auto& l : r.found) j["found"].push_back({{"path", l.path}, {"what", l.what}, {"fate", l.fate}});
  j["restored"] = r.discard.restored;
  j["removed"] = r.discard.removed;
  j["kept"] = r.discard.kept;
  return j;
}

std::string recover_text(const RecoverReport& r) {
  std::string out;
  if (r.found.empty()) return "nothing to recover\n";
  if (r.had_journal)
    out += r.discarded ? "rolled the interrupted transaction back\n" : "finished the interrupted transaction\n";
  for (const auto& p : r.discard.restored) out += "restored " + p + "\n";
  for (const auto& p : r.discard.removed) out += "removed " + p + "\n";
  for (const auto& p : r.discard.kept) out += "kept " + p + "\n";
  for (const auto& l : r.found)
    if (l.what != "journal") out += "cleared leftover " + l.what + " " + l.path + "\n";
  return out;
}

}  // namespace patcher
