#include "test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "sha256.h"

extern char** environ;

namespace patcher::testing {

namespace fs = std::filesystem;

// KVTIER_OVERLAY_BIN runs the tests against another build (e.g. an older
// commit's binary, to see a regression test fail there).
std::string overlay_bin() {
  const char* alt = std::getenv("KVTIER_OVERLAY_BIN");
  return alt && *alt ? alt : OVERLAY_BIN;
}
std::string source_dir() { return KVTIER_SOURCE_DIR; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string sha256_file(const std::string& path) { return kvtier::sha256_hex(read_file(path)); }

static void walk(const std::string& root, const std::string& rel, Snapshot& snap) {
  std::string path = rel.empty() ? root : root + "/" + rel;
  DIR* d = ::opendir(path.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    std::string r = rel.empty() ? n : rel + "/" + n;
    std::string p = root + "/" + r;
    struct stat st {};
    ::lstat(p.c_str(), &st);
    Entry en;
    en.mtime_ns = static_cast<long long>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    en.mode = st.st_mode;
    if (S_ISREG(st.st_mode)) en.bytes = read_file(p);
    if (S_ISLNK(st.st_mode)) {
      char buf[4096];
      ssize_t k = ::readlink(p.c_str(), buf, sizeof buf);
      en.bytes.assign(buf, k > 0 ? static_cast<size_t>(k) : 0);
    }
    snap[r] = en;
    if (S_ISDIR(st.st_mode)) walk(root, r, snap);
  }
  ::closedir(d);
}

Snapshot snapshot(const std::string& dir) {
  Snapshot s;
  walk(dir, "", s);
  return s;
}

std::string diff_snapshots(const Snapshot& a, const Snapshot& b, bool dir_mtimes) {
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) return "removed: " + k;
    if (it->second.bytes != v.bytes) return "bytes changed: " + k;
    bool is_dir = S_ISDIR(v.mode);
    if (it->second.mtime_ns != v.mtime_ns && (dir_mtimes || !is_dir)) return "mtime changed: " + k;
    if (it->second.mode != v.mode) return "mode changed: " + k;
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) return "added: " + k;
  return "";
}

std::string diff_bytes(const Snapshot& a, const Snapshot& b) {
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end()) return "removed: " + k;
    if (it->second.bytes != v.bytes) return "bytes changed: " + k;
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) return "added: " + k;
  return "";
}

RunResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  char out_tmpl[] = "/tmp/overlay-test-out-XXXXXX";
  char err_tmpl[] = "/tmp/overlay-test-err-XXXXXX";
  int out_fd = ::mkstemp(out_tmpl), err_fd = ::mkstemp(err_tmpl);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string key = kv.substr(0, kv.find('='));
    if (!env.count(key) && key != "OVERLAY_FAULT") envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = 0;
  RunResult r;
  if (posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data()) != 0) throw std::runtime_error("spawn failed");
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ::close(out_fd);
  ::close(err_fd);
  r.out = read_file(out_tmpl);
  r.err = read_file(err_tmpl);
  ::unlink(out_tmpl);
  ::unlink(err_tmpl);
  return r;
}

Workspace::Workspace() {
  char tmpl[] = "/tmp/overlay-test-XXXXXX";
  dir = ::mkdtemp(tmpl);
  tree = dir + "/tree";
  manifests = dir + "/anchors/example-1.0";
  overlays = dir + "/overlays";
  fs::copy(source_dir() + "/fixtures/example", tree, fs::copy_options::recursive);
  fs::create_directories(manifests);
  fs::copy(source_dir() + "/anchors/example-1.0", manifests, fs::copy_options::recursive);
  fs::create_directories(overlays);
  for (const char* o : {"example-cache", "example-cache-stats"})
    fs::copy(source_dir() + "/overlays/" + o, overlays + "/" + o, fs::copy_options::recursive);
}

Workspace::~Workspace() {
  std::error_code ec;
  // Tests may leave read-only directories behind.
  for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::recursive_directory_iterator(); ++it)
    if (it->is_directory(ec) && !it->is_symlink(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(dir, ec);
}

RunResult Workspace::run(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) const {
  std::vector<std::string> argv = {overlay_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--root");
  argv.push_back(tree);
  argv.push_back("--manifests");
  argv.push_back(manifests);
  return run_process(argv, env);
}

std::vector<FaultStep> fault_steps(const Workspace& w, const std::vector<std::string>& args) {
  auto r = w.run(args, {{"OVERLAY_FAULT", "list"}});
  std::vector<FaultStep> out;
  if (r.code != 0) return out;
  std::map<std::string, int> seen;
  const std::string tag = "overlay-fault-step ";
  size_t p = 0;
  while ((p = r.err.find(tag, p)) != std::string::npos) {
    size_t e = r.err.find('\n', p);
    std::string name = r.err.substr(p + tag.size(), e - p - tag.size());
    out.push_back({name, ++seen[name]});
    p = e;
  }
  return out;
}

}  // namespace patcher::testing
