// kvtier-cxxscope: the Clang AST as the authority on C, C++ and CUDA scopes.
//
// Reads a JSON array of requests on stdin, parses each file with its compile
// flags (syntax only: nothing is built) and prints one JSON array of results:
// every definition's exact line range (namespaces, classes/structs/unions,
// functions, methods), the lines of inactive preprocessor branches and of
// multi-line #define bodies, the errors with their lines, and the headers that
// could not be found. The overlay engine runs it once per operation for all
// its C/C++ files and decides everything else itself.
//
//   request: {"root": DIR, "file": REL, "args": [...], "files": {REL: TEXT}}
//     root   the tree; relative -I paths and "file" are taken from it
//     files  contents that replace what is on disk (the patched text, new files)
//   result:  {"file", "ok", "error", "definitions": [{"kind", "name",
//            "qualified", "begin", "end", "name_line", "valid", "why"}],
//            "inactive": [[first, last]], "macros": [[first, last]],
//            "diagnostics": [{"severity", "file", "line", "message"}],
//            "missing_headers": [...], "seconds"}   (lines 1-based, inclusive)
//
// A header that cannot be found (torch, the CUDA toolkit, Python.h on a
// machine without them) is recovered as an empty file and listed, instead of
// the fatal error that would stop the parse: Clang's error recovery then keeps
// every definition's braces where they are. One translation unit on purpose:
// compiling against Clang's headers is slow.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "clang/AST/ASTConsumer.h"
#include "clang/AST/ASTContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/Basic/Diagnostic.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Frontend/CompilerInstance.h"
#include "clang/Frontend/FrontendAction.h"
#include "clang/Lex/PPCallbacks.h"
#include "clang/Lex/Preprocessor.h"
#include "clang/Tooling/Tooling.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/VirtualFileSystem.h"
#include "llvm/Support/raw_ostream.h"

#ifndef KVTIER_CLANG_EXE
#define KVTIER_CLANG_EXE "clang++"
#endif

namespace {

namespace json = llvm::json;
using clang::SourceLocation;

constexpr const char* kMissingDir = "/kvtier-missing-headers";

struct Collected {
  json::Array definitions, inactive, macros, diagnostics;
  std::vector<std::string> missing;
};

unsigned line_of(const clang::SourceManager& sm, SourceLocation loc) {
  return sm.getExpansionLineNumber(loc);
}

bool in_main_file(const clang::SourceManager& sm, SourceLocation loc) {
  return loc.isValid() && sm.isInMainFile(sm.getExpansionLoc(loc));
}

// Errors with the line they point at; notes and warnings are not ours to judge.
class Diagnostics : public clang::DiagnosticConsumer {
 public:
  explicit Diagnostics(Collected& out) : out_(out) {}
  void HandleDiagnostic(clang::DiagnosticsEngine::Level level, const clang::Diagnostic& info) override {
    clang::DiagnosticConsumer::HandleDiagnostic(level, info);
    if (level < clang::DiagnosticsEngine::Error) return;
    llvm::SmallString<256> msg;
    info.FormatDiagnostic(msg);
    json::Object d{{"severity", level == clang::DiagnosticsEngine::Fatal ? "fatal" : "error"},
                   {"message", std::string(msg)}};
    if (info.hasSourceManager() && info.getLocation().isValid()) {
      const clang::SourceManager& sm = info.getSourceManager();
      clang::PresumedLoc p = sm.getPresumedLoc(sm.getFileLoc(info.getLocation()), /*UseLineDirectives=*/false);
      if (p.isValid()) {
        d["file"] = std::string(p.getFilename());
        d["line"] = static_cast<int64_t>(p.getLine());
      }
    }
    out_.diagnostics.push_back(std::move(d));
  }

 private:
  Collected& out_;
};

class Preprocessing : public clang::PPCallbacks {
 public:
  Preprocessing(Collected& out, const clang::SourceManager& sm, llvm::vfs::InMemoryFileSystem& missing_fs)
      : out_(out), sm_(sm), missing_fs_(missing_fs) {}

  // The range runs from the '#' of the directive opening the dead block to
  // the end of the directive closing it: the lines between are inactive.
  void SourceRangeSkipped(clang::SourceRange range, SourceLocation) override {
    if (!in_main_file(sm_, range.getBegin())) return;
    unsigned first = line_of(sm_, range.getBegin()) + 1, last = line_of(sm_, range.getEnd());
    if (last > first) out_.inactive.push_back(json::Array{first, last - 1});
  }

  void MacroDefined(const clang::Token& name, const clang::MacroDirective* md) override {
    const clang::MacroInfo* mi = md->getMacroInfo();
    if (!mi || !in_main_file(sm_, name.getLocation())) return;
    unsigned first = line_of(sm_, mi->getDefinitionLoc()), last = line_of(sm_, mi->getDefinitionEndLoc());
    if (last > first) out_.macros.push_back(json::Array{first, last});
  }

  // Recover from a header that is not here with an empty one. Each gets its
  // own search folder: the file manager remembers a path it once failed to
  // find, so a folder already searched cannot take a new file.
  bool FileNotFound(llvm::StringRef name, llvm::SmallVectorImpl<char>& recovery_path) override {
    std::string dir = std::string(kMissingDir) + "/" + std::to_string(out_.missing.size());
    missing_fs_.addFile(dir + "/" + name.str(), 0, llvm::MemoryBuffer::getMemBuffer(""));
    out_.missing.push_back(name.str());
    recovery_path.assign(dir.begin(), dir.end());
    return true;
  }

 private:
  Collected& out_;
  const clang::SourceManager& sm_;
  llvm::vfs::InMemoryFileSystem& missing_fs_;
};

class Visitor : public clang::RecursiveASTVisitor<Visitor> {
 public:
  Visitor(Collected& out, const clang::SourceManager& sm) : out_(out), sm_(sm) {}
  bool shouldVisitTemplateInstantiations() const { return false; }
  bool shouldVisitImplicitCode() const { return false; }

  bool VisitNamespaceDecl(clang::NamespaceDecl* d) {
    add(d, "namespace", d->isAnonymousNamespace() ? "(anonymous)" : d->getNameAsString(), d->getBeginLoc(),
        d->getRBraceLoc());
    return true;
  }

  bool VisitRecordDecl(clang::RecordDecl* d) {
    if (!d->isThisDeclarationADefinition() || d->isImplicit() || d->getName().empty()) return true;
    if (auto* cxx = llvm::dyn_cast<clang::CXXRecordDecl>(d); cxx && cxx->isLambda()) return true;
    SourceLocation begin = d->getBeginLoc();
    if (auto* cxx = llvm::dyn_cast<clang::CXXRecordDecl>(d))
      if (auto* t = cxx->getDescribedClassTemplate()) begin = t->getBeginLoc();
    const char* kind = d->isUnion() ? "union" : d->isClass() ? "class" : "struct";
    add(d, kind, d->getNameAsString(), begin, d->getBraceRange().getEnd());
    return true;
  }

  bool VisitFunctionDecl(clang::FunctionDecl* d) {
    if (!d->doesThisDeclarationHaveABody() || d->isTemplateInstantiation() || d->isImplicit()) return true;
    clang::Stmt* body = d->getBody();
    if (!body) return true;
    SourceLocation begin = d->getBeginLoc();
    if (auto* t = d->getDescribedFunctionTemplate()) begin = t->getBeginLoc();
    SourceLocation end = body->getEndLoc();
    if (auto* cs = llvm::dyn_cast<clang::CompoundStmt>(body)) end = cs->getRBracLoc();
    const char* kind = llvm::isa<clang::CXXMethodDecl>(d) ? "method" : "function";
    add(d, kind, d->getNameAsString(), begin, end);
    return true;
  }

 private:
  // A definition is valid when its first line, its name and its closing
  // brace are all written in this file (not produced by a macro) in order,
  // and the closing location really holds a '}'. Anything else is reported
  // as invalid so the engine refuses instead of guessing.
  void add(clang::NamedDecl* d, const char* kind, const std::string& name, SourceLocation begin, SourceLocation end) {
    SourceLocation name_loc = d->getLocation();
    if (!in_main_file(sm_, name_loc)) return;
    std::string why;
    if (begin.isInvalid() || end.isInvalid()) why = "no source range";
    else if (sm_.isMacroBodyExpansion(name_loc) || end.isMacroID())
      why = "written by a macro";  // a macro at the start (`__device__ void f`) is fine
    begin = sm_.getExpansionLoc(begin);
    name_loc = sm_.getExpansionLoc(name_loc);
    if (why.empty() && (!sm_.isInMainFile(begin) || !sm_.isInMainFile(end))) why = "range leaves the file";
    if (why.empty() && *sm_.getCharacterData(end) != '}') why = "no closing brace where the definition ends";
    unsigned b = line_of(sm_, begin), e = line_of(sm_, end), n = line_of(sm_, name_loc);
    if (why.empty() && !(b <= n && n <= e)) why = "name outside its own range";
    json::Object o{{"kind", kind},
                   {"name", name},
                   {"qualified", d->getQualifiedNameAsString()},
                   {"begin", static_cast<int64_t>(b)},
                   {"end", static_cast<int64_t>(e)},
                   {"name_line", static_cast<int64_t>(n)},
                   {"valid", why.empty()},
                   {"invalid_decl", d->isInvalidDecl()}};
    if (!why.empty()) o["why"] = why;
    out_.definitions.push_back(std::move(o));
  }

  Collected& out_;
  const clang::SourceManager& sm_;
};

class Consumer : public clang::ASTConsumer {
 public:
  explicit Consumer(Collected& out) : out_(out) {}
  void HandleTranslationUnit(clang::ASTContext& ctx) override {
    Visitor v(out_, ctx.getSourceManager());
    v.TraverseDecl(ctx.getTranslationUnitDecl());
  }

 private:
  Collected& out_;
};

class Action : public clang::ASTFrontendAction {
 public:
  Action(Collected& out, llvm::vfs::InMemoryFileSystem& missing_fs) : out_(out), missing_fs_(missing_fs) {}

 protected:
  std::unique_ptr<clang::ASTConsumer> CreateASTConsumer(clang::CompilerInstance& ci, llvm::StringRef) override {
    // Keep going after errors: every error with its line is what we want.
    ci.getDiagnostics().setErrorLimit(0);
    ci.getPreprocessor().addPPCallbacks(
        std::make_unique<Preprocessing>(out_, ci.getSourceManager(), missing_fs_));
    return std::make_unique<Consumer>(out_);
  }

 private:
  Collected& out_;
  llvm::vfs::InMemoryFileSystem& missing_fs_;
};

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Language flags by extension. CUDA is parsed for the host only and without
// the toolkit; its keywords are given the meaning the toolkit's headers give.
std::vector<std::string> language_args(const std::string& file) {
  if (has_suffix(file, ".c")) return {"-x", "c"};
  if (has_suffix(file, ".cu") || has_suffix(file, ".cuh"))
    return {"-x",
            "cuda",
            "--cuda-host-only",
            "-nocudainc",
            "-nocudalib",
            "-D__global__=__attribute__((global))",
            "-D__device__=__attribute__((device))",
            "-D__host__=__attribute__((host))",
            "-D__shared__=__attribute__((shared))",
            "-D__constant__=__attribute__((constant))",
            "-D__forceinline__=inline __attribute__((always_inline))",
            "-D__launch_bounds__(...)=__attribute__((launch_bounds(__VA_ARGS__)))"};
  if (has_suffix(file, ".h")) return {"-x", "c++-header"};
  return {"-x", "c++"};
}

json::Object run_one(const json::Object& req) {
  auto started = std::chrono::steady_clock::now();
  json::Object result;
  std::string root = req.getString("root").getValueOr(".").str();
  std::string file = req.getString("file").getValueOr("").str();
  result["file"] = file;
  if (file.empty()) {
    result["ok"] = false;
    result["error"] = "request without \"file\"";
    return result;
  }
  std::string abs_file = file[0] == '/' ? file : root + "/" + file;

  llvm::IntrusiveRefCntPtr<llvm::vfs::FileSystem> real(llvm::vfs::createPhysicalFileSystem().release());
  auto overlay = llvm::makeIntrusiveRefCnt<llvm::vfs::OverlayFileSystem>(real);
  auto mapped = llvm::makeIntrusiveRefCnt<llvm::vfs::InMemoryFileSystem>();
  auto missing = llvm::makeIntrusiveRefCnt<llvm::vfs::InMemoryFileSystem>();
  overlay->pushOverlay(mapped);
  overlay->pushOverlay(missing);
  overlay->setCurrentWorkingDirectory(root);
  if (const json::Object* files = req.getObject("files"))
    for (const auto& kv : *files) {
      std::string rel = kv.first.str();
      std::string path = rel[0] == '/' ? rel : root + "/" + rel;
      auto text = kv.second.getAsString();
      if (text) mapped->addFile(path, 0, llvm::MemoryBuffer::getMemBufferCopy(*text, path));
    }

  // -fno-caret-diagnostics also stops clang printing "N errors generated".
  std::vector<std::string> cmd = {KVTIER_CLANG_EXE, "-fsyntax-only", "-w", "-fno-caret-diagnostics"};
  for (auto& a : language_args(file)) cmd.push_back(a);
  if (const json::Array* args = req.getArray("args"))
    for (const auto& a : *args)
      if (auto s = a.getAsString()) cmd.push_back(s->str());
  cmd.push_back(abs_file);

  Collected out;
  Diagnostics diags(out);
  auto fm = llvm::makeIntrusiveRefCnt<clang::FileManager>(clang::FileSystemOptions{root}, overlay);
  clang::tooling::ToolInvocation inv(cmd, std::make_unique<Action>(out, *missing), fm.get());
  inv.setDiagnosticConsumer(&diags);
  bool ran = inv.run();

  result["ok"] = ran || !out.definitions.empty() || !out.diagnostics.empty();
  if (!ran && out.definitions.empty() && out.diagnostics.empty()) result["error"] = "clang could not parse the file";
  result["definitions"] = std::move(out.definitions);
  result["inactive"] = std::move(out.inactive);
  result["macros"] = std::move(out.macros);
  result["diagnostics"] = std::move(out.diagnostics);
  json::Array miss;
  for (auto& m : out.missing) miss.push_back(m);
  result["missing_headers"] = std::move(miss);
  result["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    std::fprintf(stderr,
                 "usage: %s < requests.json\n"
                 "  stdin: [{\"root\": DIR, \"file\": REL, \"args\": [...], \"files\": {REL: TEXT}}, ...]\n"
                 "  stdout: one JSON result per request (see the top of cxxscope.cpp)\n",
                 argv[0]);
    return 2;
  }
  auto input = llvm::MemoryBuffer::getSTDIN();
  if (!input) {
    std::fprintf(stderr, "kvtier-cxxscope: cannot read stdin\n");
    return 2;
  }
  auto parsed = json::parse((*input)->getBuffer());
  if (!parsed) {
    std::fprintf(stderr, "kvtier-cxxscope: stdin is not JSON: %s\n", llvm::toString(parsed.takeError()).c_str());
    return 2;
  }
  const json::Array* reqs = parsed->getAsArray();
  if (!reqs) {
    std::fprintf(stderr, "kvtier-cxxscope: stdin must be a JSON array of requests\n");
    return 2;
  }
  json::Array results;
  for (const auto& r : *reqs) {
    const json::Object* o = r.getAsObject();
    if (!o) {
      results.push_back(json::Object{{"ok", false}, {"error", "request is not an object"}});
      continue;
    }
    results.push_back(run_one(*o));
  }
  llvm::outs() << json::Value(std::move(results)) << "\n";
  return 0;
}
