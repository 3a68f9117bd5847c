// The `overlay` CLI: wires CLI11 to the engine, prints, picks exit codes.
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "conventions.h"
#include "cxx_backend.h"
#include "engine.h"
#include "found_root.h"
#include "locate.h"
#include "render.h"
#include "wheel_default.h"

using namespace patcher;

namespace {

struct Args {
  std::string root, manifests, fragments, engine = "vllm", engine_version, python = "python3", expect = "applied";
  std::string pristine, sources, root_pos, command;
  std::vector<std::string> overlays;
  bool json = false, check_injected = false, revert = false, diff = false, discard = false;
  bool quiet = false, verbose = false, rebuild_binaries = false, new_files_only = false;
};

// The envelope every --json document shares (docs/JSON.md, cli/).
nlohmann::json envelope(nlohmann::json j, const Args& a, int code) {
  j["schema_version"] = kvtier::cli::kSchemaVersion;
  j["tool"] = "overlay";
  j["command"] = a.command;
  j["ok"] = code == 0;
  j["exit_code"] = code;
  return j;
}

std::string self_exe(const char* argv0) {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) return std::string(buf, static_cast<size_t>(n));
  return argv0;
}

int fail(const Args& a, const Error& e) {
  if (a.json) {
    auto j = error_json(e);
    // The exit code's name, the same word kvstore uses ("unsafe" for 4), and
    // the message as kvstore gives it: the whole line stderr shows, file
    // included ("file" and "line" stay for those who read them).
    j["error"]["kind"] = kvtier::cli::exit_code_name(static_cast<int>(e.kind));
    j["error"]["message"] = escape_controls(e.line());
    std::cout << envelope(std::move(j), a, static_cast<int>(e.kind)).dump(2) << "\n";
  }
  std::cerr << "overlay: " << kind_name(e.kind) << ": " << escape_controls(e.line()) << "\n";
  if (!a.json)
    for (const auto& d : e.details) std::cerr << "  " << escape_controls(d) << "\n";
  return static_cast<int>(e.kind);
}

// ${XDG_CACHE_HOME:-~/.cache}/kvtier/engines/<engine>-<version>: where
// fixtures/fetch.py keeps verified pristine copies ("" when absent).
std::string default_pristine_dir(const std::string& engine, const std::string& version,
                                 const char* kind = "engines") {
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) base = x;
  else if (const char* h = std::getenv("HOME"); h && *h) base = std::string(h) + "/.cache";
  else return "";
  std::string dir = base + "/kvtier/" + kind + "/" + engine + "-" + version;
  return ::access(dir.c_str(), F_OK) == 0 ? dir : "";
}

// The releases of `engine` with manifests under `anchors` (example-* aside),
// in version order, comma-separated.
std::string supported_releases(const std::string& anchors, const std::string& engine) {
  std::vector<std::string> found;
  if (DIR* d = ::opendir(anchors.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind(engine + "-", 0) == 0 && ::access((anchors + "/" + n + "/ORDER").c_str(), F_OK) == 0)
        found.push_back(n.substr(engine.size() + 1));
    }
    ::closedir(d);
  }
  std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
    return ::strverscmp(a.c_str(), b.c_str()) < 0;
  });
  std::string out;
  for (const auto& v : found) out += (out.empty() ? "" : ", ") + v;
  return out.empty() ? "none" : out;
}

// No manifests for the release the tree holds: an upgraded (or not yet
// supported) engine. Drift, not a usage error: the tree is not one these pins
// describe. Names the supported releases and the next steps.
Error unsupported_release(const Args& a, const std::string& anchors, const std::string& version, bool named) {
  std::string supported = supported_releases(anchors, a.engine);
  if (named)
    return make_error(ErrorKind::Usage, anchors + "/" + a.engine + "-" + version,
                      "no manifests for " + a.engine + " " + version + " (--engine-version); this kvtier supports " +
                          a.engine + " " + supported);
  std::string newest = supported.substr(supported.rfind(' ') + 1);
  Error e = make_error(ErrorKind::Drift, a.root,
                       "holds " + a.engine + " " + version + ", which this kvtier does not support (it supports " +
                           a.engine + " " + supported + ")");
  e.details = {"next: install a supported release (pip install " + a.engine + "==" + newest +
                   "), or a kvtier that supports " + version + " (docs/UPGRADING.md has the support matrix)",
               "to remove what the overlays of an earlier release left in this tree: overlay revert "
               "--new-files-only --engine-version OLD (it never touches " +
                   a.engine + "'s own files)"};
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  Args a;
  CLI::App app{"overlay: carry source overlays into a pinned engine tree, failing closed.", "overlay"};
  app.footer(kvtier::cli::exit_code_help());
  app.fallthrough();
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", kvtier::cli::version_text("overlay"));
  app.add_option("--root", a.root, "engine tree to act on (e.g. a site-packages folder); or ROOT after the command");
  app.add_flag("-q,--quiet", a.quiet, "print nothing on success (errors still go to stderr)");
  app.add_flag("-v,--verbose", a.verbose, "more detail: check and apply also print every overlay's and file's state");
  app.add_option("--overlays", a.overlays, "overlays to act on, comma-separated (default: all)")->delimiter(',');
  app.add_option("--manifests", a.manifests,
                 "manifest folder (default: <anchors>/<engine>-<version> next to the executable)");
  app.add_option("--fragments", a.fragments, "overlays folder holding <overlay>/ fragments (default: <manifests>/../../overlays)");
  app.add_option("--engine", a.engine, "engine name for the default manifest folder")->capture_default_str();
  app.add_option("--engine-version", a.engine_version, "engine version (default: detected from the tree)");
  app.add_flag("--json", a.json, "one JSON document on stdout (docs/JSON.md), also on failure");
  app.add_option("--pristine", a.pristine,
                 "folder of pristine copies of the targets, to diff a pin-only drift against (default: the fetch "
                 "cache, ${XDG_CACHE_HOME:-~/.cache}/kvtier/engines/<engine>-<version>, when present)");
  app.add_flag("--check-injected", a.check_injected, "apply/check: compile patched files and fragments first");
  app.add_option("--python", a.python, "interpreter for --check-injected")->capture_default_str();
  app.add_option("--sources", a.sources,
                 "apply: pinned C/C++ sources that [[built_files]] are rebuilt from on a wheel install "
                 "(default: the fetch cache's sources/<engine>-<version>, from fixtures/fetch.py --sources)");
  app.add_flag("--rebuild-binaries", a.rebuild_binaries,
               "from the wheel, without --overlays: also take the overlays that rebuild an engine binary "
               "([[built_files]]), left out by default (they need kvtier-cxxscope and the pinned C/C++ sources)");
  app.add_subcommand("status", "report the state of every overlay and file");
  auto* plan = app.add_subcommand("plan", "show what apply (or revert) would change; writes nothing");
  plan->add_flag("--revert", a.revert, "plan a revert instead of an apply");
  plan->add_flag("--diff", a.diff, "also print a unified diff of every file it would write");
  app.add_subcommand("apply", "apply overlays (all anchors resolved before any write)");
  auto* check_cmd = app.add_subcommand("check", "read-only: exit 0 only if overlays are in the expected state");
  check_cmd->add_option("--expect", a.expect, "applied or pristine")
      ->check(CLI::IsMember({"applied", "pristine"}))
      ->capture_default_str();
  auto* revert_cmd = app.add_subcommand("revert", "remove overlays, restoring pristine bytes");
  for (CLI::App* sub : {revert_cmd, plan})
    sub->add_flag("--new-files-only", a.new_files_only,
                  "revert: remove only what the overlays added (their new files, the folders they made and what a "
                  "bake recorded in them), never an engine file, whatever state those are in: for a tree whose "
                  "engine was upgraded or reinstalled under the overlays (docs/UPGRADING.md)");
  auto* recover_cmd = app.add_subcommand(
      "recover", "finish an interrupted transaction (or roll it back with --discard); remove leftovers");
  recover_cmd->add_flag("--discard", a.discard,
                        "roll the interrupted transaction back: saved old bytes return, files it created go; "
                        "a file edited before it got its new bytes is kept (one edited after: refused)");
  // ROOT the same way as kvstore: positional after the command, or --root.
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    sub->add_option("ROOT", a.root_pos, "engine tree to act on (the same as --root)");
    sub->footer(kvtier::cli::exit_code_help());
  }
  // --json may not have been parsed yet when a failure comes: every failure
  // under --json is a JSON document.
  a.json = kvtier::cli::wants_json(argc, argv);
  if (argc == 1) {
    std::cerr << app.help();
    return static_cast<int>(ErrorKind::Usage);
  }
  if (std::string bad = kvtier::cli::precheck(app, argc, argv); !bad.empty())
    return fail(a, make_error(ErrorKind::Usage, "", bad + " (see overlay --help)"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    // A subcommand's help lists its own options, then every global one.
    const CLI::App* sub = nullptr;
    for (int i = 1; i < argc && sub == nullptr; ++i)
      for (const CLI::App* c : app.get_subcommands([](const CLI::App*) { return true; }))
        if (c->get_name() == argv[i]) sub = c;
    if (sub == nullptr) {
      std::cout << app.help();
      return 0;
    }
    // The options every command takes are global (before or after the
    // command): listed right after the command's own, before the exit codes.
    std::string help = sub->help("overlay");
    size_t footer = help.find("\nExit codes");
    std::string global = "\nOptions of every command (before or after it):\n";
    for (const CLI::Option* o : app.get_options()) {
      if (o->get_name() == "--help") continue;
      std::string names = o->get_name(false, true);
      std::string type = o->get_type_size() == 0 ? "" : " " + o->get_type_name();
      global += "  " + names + type + "\n      " + o->get_description() + "\n";
    }
    std::cout << help.insert(footer == std::string::npos ? help.size() : footer, global);
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << kvtier::cli::version_text("overlay");
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    return fail(a, make_error(ErrorKind::Usage, "", std::string(e.what()) + " (see overlay --help)"));
  }
  std::string cmd = app.get_subcommands().front()->get_name();
  a.command = cmd;
  if (!a.root.empty() && !a.root_pos.empty() && a.root != a.root_pos)
    return fail(a, make_error(ErrorKind::Usage, "", "ROOT given twice, as " + a.root_pos + " and --root " + a.root));
  if (a.root.empty()) a.root = a.root_pos;
  // From the wheel (packaging/wheel/kvtier/_cli.py): without ROOT, the tree
  // holding the engine installed for the shim's Python; --check-injected
  // compiles with that Python unless --python says otherwise.
  const char* pip_env = std::getenv("KVTIER_PIP_ENV");
  PipEnv pip = read_pip_env(pip_env);
  if (pip.present && !pip.python.empty() && app.count("--python") == 0) a.python = pip.python;
  if (a.root.empty() && pip.present) {
    auto found = root_from_pip_env(pip_env, a.engine);
    if (!found) return fail(a, found.error());
    a.root = found->root;
    if (!a.quiet) std::cerr << "overlay: " << escape_controls(found->note) << "\n";
  }
  if (a.root.empty())
    return fail(a, make_error(ErrorKind::Usage, "", "ROOT is required: overlay " + cmd + " ROOT, or --root ROOT"));
  if (struct stat st; ::stat(a.root.c_str(), &st) != 0)
    return fail(a, make_error(ErrorKind::Usage, a.root, "does not exist"));
  if (a.quiet && a.verbose) return fail(a, make_error(ErrorKind::Usage, "", "-q and -v contradict each other"));

  std::string version = a.engine_version;
  if (a.manifests.empty()) {
    auto anchors = find_anchors_root(self_exe(argv[0]));
    if (!anchors) return fail(a, anchors.error());
    if (version.empty()) {
      auto v = detect_engine_version(a.root, a.engine);
      if (!v) return fail(a, v.error());
      version = *v;
    }
    a.manifests = *anchors + "/" + a.engine + "-" + version;
    if (::access(a.manifests.c_str(), F_OK) != 0)
      return fail(a, unsupported_release(a, *anchors, version, !a.engine_version.empty()));
  }
  if (a.fragments.empty()) a.fragments = a.manifests + "/../../overlays";
  for (std::string* p : {&a.manifests, &a.fragments})
    if (char* real = ::realpath(p->c_str(), nullptr)) {
      *p = real;
      std::free(real);
    }
  auto set = load_manifests(a.manifests, a.fragments);
  if (!set) return fail(a, set.error());
  auto tree = Tree::open(a.root);
  if (!tree) return fail(a, tree.error());
  if (a.pristine.empty() && version.empty())
    if (auto v = detect_engine_version(a.root, a.engine)) version = *v;
  if (a.pristine.empty() && !version.empty()) a.pristine = default_pristine_dir(a.engine, version);
  if (a.sources.empty() && !version.empty()) a.sources = default_pristine_dir(a.engine, version, "sources");
  cxx::configure_root(a.root);  // C/C++ targets: relative -I and compile_commands start here
  cxx::configure_python(a.python);
  Session s{std::move(*tree), std::move(*set), a.pristine};
  Request r;
  r.overlays = a.overlays;
  r.check_injected = a.check_injected;
  r.python = a.python;
  r.expect_pristine = a.expect == "pristine";
  r.sources = a.sources;
  r.new_files_only = a.new_files_only;
  if (a.new_files_only && !(cmd == "revert" || (cmd == "plan" && a.revert)))
    return fail(a, make_error(ErrorKind::Usage, "", "--new-files-only is for revert (and plan --revert)"));
  // From the wheel without --overlays: apply, plan and check take the set
  // without the overlays that rebuild an engine binary (wheel_default.h);
  // revert and check --expect pristine still take every overlay.
  if (pip.present && a.overlays.empty() &&
      (cmd == "apply" || (cmd == "plan" && !a.revert) || (cmd == "check" && !r.expect_pristine))) {
    Result<OverlayReport> now = Error{};
    if (cmd == "check") now = status(s);  // an overlay applied anyway is checked too
    if (cmd == "check" && !now) return fail(a, now.error());
    DefaultSet d = wheel_default_set(s.set, a.rebuild_binaries, cmd == "check" ? &now->state : nullptr);
    if (d.overlays.empty())
      return fail(a, make_error(ErrorKind::Usage, a.manifests,
                                "every overlay here rebuilds an engine binary; pass --rebuild-binaries or --overlays"));
    if (!d.left_out.empty()) r.overlays = d.overlays;
    if (!a.quiet)
      for (const auto& l : d.left_out)
        std::cerr << "overlay: leaving out " << l << ": it changes vLLM's own code even at knob 0 and needs "
                  << "kvtier-cxxscope and the pinned C/C++ sources, which the wheel does not carry; "
                  << "--rebuild-binaries takes it in\n";
  }

  if (cmd == "recover") {
    auto rec = recover_tree(s, a.discard);
    if (!rec) return fail(a, rec.error());
    if (a.json)
      std::cout << envelope(recover_json(*rec), a, 0).dump(2) << "\n";
    else if (!a.quiet)
      std::cout << recover_text(*rec);
    return 0;
  }
  Result<OverlayReport> out = Error{};
  std::string label = cmd;
  if (cmd == "status") {
    out = status(s);
  } else if (cmd == "plan") {
    label = a.revert ? "plan-revert" : "plan";
    out = a.revert ? plan_revert(s, r) : plan_apply(s, r);
  } else if (cmd == "apply") {
    out = apply(s, r);
  } else if (cmd == "revert") {
    out = revert(s, r);
  } else {
    out = check(s, r);
  }
  if (!out) return fail(a, out.error());
  if (a.json) {
    // One shape for every command: what it did, then the tree's state.
    a.command = label;
    std::cout << envelope(report_json(label, *out), a, 0).dump(2) << "\n";
  } else if (a.quiet) {
  } else if (cmd == "status") {
    std::cout << state_text(out->state);
  } else if (cmd == "check") {
    // An absent overlay (its C/C++ sources and binary not in this tree) is
    // accepted like one superseded upstream, but it is neither applied nor
    // pristine: it is named apart, never in the ok line.
    auto absent = [&](const std::string& n) {
      const OverlayState* os = out->state.overlay(n);
      return os != nullptr && os->state == OverlayStatus::Absent;
    };
    std::cout << "ok: " << (r.expect_pristine ? "pristine" : "applied");
    for (const auto& n : out->selected)
      if (!absent(n)) std::cout << " " << n;
    std::cout << "\n";
    for (const auto& n : out->selected)
      if (absent(n))
        std::cout << "  " << n << ": absent, not checked (neither its C/C++ sources nor the binary built from them "
                  << "is in this tree)\n";
    if (out->compiled) std::cout << "compiled " << out->compiled << " files and fragments: ok\n";
    if (a.verbose) std::cout << state_text(out->state);
  } else {
    std::cout << report_text(label, *out, a.diff);
    if (a.verbose) std::cout << state_text(out->state);
  }
  // pip runs no code on uninstall: it cannot revert, so say it here.
  if (cmd == "apply" && pip.present && !a.quiet)
    std::cerr << "overlay: note: run `overlay revert` before `pip uninstall kvtier`: pip runs no uninstall hook, so "
                 "it leaves the overlays applied (a kvtier installed again can revert them)\n";
  return 0;
}
