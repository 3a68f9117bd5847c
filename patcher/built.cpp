#include "built.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "sha256.h"

extern char** environ;

namespace patcher::built {
namespace {

std::string beside(const std::string& path, const char* suffix) {
  std::string dir = dir_name(path);
  return (dir.empty() ? "" : dir + "/") + "." + base_name(path) + suffix;
}

// Runs argv, returning its exit status and the last of its output.
Result<std::pair<int, std::string>> run(const std::vector<std::string>& argv, const std::string& cwd) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return make_error(ErrorKind::Io, "", "cannot create a pipe: " + errno_text(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return make_error(ErrorKind::Usage, argv[0], "cannot run: " + errno_text(rc));
  }
  std::string text;
  char buf[8192];
  while (true) {
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text);
}

std::vector<std::string> last_lines(const std::string& text, size_t n) {
  std::vector<std::string> lines = split_lines(text).lines;
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<long>(n));
  for (auto& l : lines) l = "  " + l;
  return lines;
}

}  // namespace

std::string backup_path(const std::string& path) { return beside(path, ".overlay-orig"); }
std::string record_path(const std::string& path) { return beside(path, ".overlay-built"); }

std::string format_record(const Record& r) {
  return "overlay-built 1\noverlay " + r.overlay + "\noriginal " + r.original + "\nbuilt " + r.built + "\n";
}

std::optional<Record> parse_record(std::string_view text) {
  Record r;
  std::vector<std::string> lines = split_lines(text).lines;
  if (lines.size() != 4 || lines[0] != "overlay-built 1") return std::nullopt;
  auto field = [&](size_t i, const char* key, std::string* out) {
    std::string k = std::string(key) + " ";
    if (lines[i].rfind(k, 0) != 0) return false;
    *out = lines[i].substr(k.size());
    return !out->empty();
  };
  if (!field(1, "overlay", &r.overlay) || !field(2, "original", &r.original) || !field(3, "built", &r.built))
    return std::nullopt;
  if (r.original.size() != 64 || r.built.size() != 64) return std::nullopt;
  return r;
}

Result<bool> wheel_mode(const Tree& tree, const Manifest& m) {
  if (m.built_files.empty()) return false;
  for (const auto& bf : m.built_files)
    for (const auto& src : bf.sources) {
      auto e = tree.exists(src);
      if (!e) return e.error();
      if (*e) return false;
    }
  return true;
}

Status analyze(const Tree& tree, const Manifest& m, const BuiltFile& bf, FileState& fs) {
  fs.is_built = true;
  fs.pin = bf.sha256;
  FileOverlay fo;
  fo.overlay = m.overlay;
  auto data = tree.read(bf.path);
  if (!data) return data.error();
  auto backup = tree.read(backup_path(bf.path));
  if (!backup) return backup.error();
  auto record = tree.read(record_path(bf.path));
  if (!record) return record.error();
  if (!data->has_value()) {
    // Neither the sources nor the binary: a tree without this extension (or a
    // trimmed copy): nothing of the overlay can apply, so nothing is half-done.
    bool leftovers = backup->has_value() || record->has_value();
    fs.state = leftovers ? FileStatus::Tampered : FileStatus::Absent;
    fs.message = leftovers ? "built file is gone but its overlay backup is there"
                           : "not in this tree, and neither are the sources it is built from: nothing to rebuild";
    return ok_status();
  }
  fs.exists = true;
  fs.data = std::move(**data);
  fs.sha = kvtier::sha256_hex(fs.data.bytes);
  if (!record->has_value() && !backup->has_value()) {
    if (fs.sha == fs.pin) {
      fs.state = FileStatus::Pristine;
      fo.state = FileOverlayStatus::Pristine;
      fs.overlays.push_back(fo);
    } else {
      fs.state = FileStatus::Drift;
      fs.message = "binary sha256 " + fs.sha.substr(0, 16) + "... differs from the pin " + fs.pin.substr(0, 16) +
                   "...: refusing to replace a binary the overlay was not written for";
    }
    return ok_status();
  }
  fs.state = FileStatus::Tampered;
  if (!record->has_value()) {
    fs.message = "an overlay backup " + backup_path(bf.path) + " without its record " + record_path(bf.path);
    return ok_status();
  }
  auto rec = parse_record((*record)->bytes);
  if (!rec || rec->overlay != m.overlay) {
    fs.message = record_path(bf.path) + " is malformed or names another overlay";
    return ok_status();
  }
  if (!backup->has_value() || kvtier::sha256_hex((*backup)->bytes) != fs.pin || rec->original != fs.pin) {
    fs.message = "the original binary kept in " + backup_path(bf.path) + " is missing or differs from the pin";
    return ok_status();
  }
  if (fs.sha != rec->built) {
    fs.message = "binary sha256 " + fs.sha.substr(0, 16) + "... is neither the pin nor the overlay's build " +
                 rec->built.substr(0, 16) + "... (replaced by something else?)";
    return ok_status();
  }
  fs.state = FileStatus::Applied;
  fo.state = FileOverlayStatus::Applied;
  fs.overlays.push_back(fo);
  fs.applied.push_back(m.overlay);
  return ok_status();
}

Result<std::string> python_include(const std::string& python) {
  static std::map<std::string, std::string> cache;
  if (auto it = cache.find(python); it != cache.end()) return it->second;
  auto r = run({python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"}, "");
  if (!r) return r.error();
  if (r->first != 0) return make_error(ErrorKind::Usage, python, "cannot ask the interpreter for its include folder");
  std::string include = r->second;
  while (!include.empty() && std::isspace(static_cast<unsigned char>(include.back()))) include.pop_back();
  cache[python] = include;
  return include;
}

namespace {

// Build folders are named overlay-build.<pid>.XXXXXX. One whose process is
// gone was left by a killed run (nothing else removes it): removed here, if
// it is ours. A pid reused by a live process keeps its folder (safe side).
void remove_stale_build_folders(const std::string& tmp) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, ec)) {
    std::string name = entry.path().filename().string();
    long pid = 0;
    int used = 0;
    if (std::sscanf(name.c_str(), "overlay-build.%ld.%*6[A-Za-z0-9]%n", &pid, &used) != 1 ||
        used != static_cast<int>(name.size()) || pid <= 0 || pid == ::getpid())
      continue;
    struct stat st {};
    if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

Result<std::string> build(const BuiltFile& bf, const std::map<std::string, std::string>& inputs,
                          const std::string& python, double* seconds) {
  auto started = std::chrono::steady_clock::now();
  std::string tmp = std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : "/tmp";
  remove_stale_build_folders(tmp);
  std::string tmpl = tmp + "/overlay-build." + std::to_string(::getpid()) + ".XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) return make_error(ErrorKind::Io, tmpl, "cannot create a build folder: " + errno_text(errno));
  std::string dir(buf.data());
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  for (const auto& [rel, text] : inputs) {
    std::filesystem::path p = std::filesystem::path(dir) / rel;
    std::error_code ec;
    std::filesystem::create_directories(p.parent_path(), ec);
    std::ofstream out(p, std::ios::binary);
    out << text;
    if (!out) return make_error(ErrorKind::Io, p.string(), "cannot write a build input");
  }
  std::string include;
  for (const auto& a : bf.build)
    if (a.find("{python_include}") != std::string::npos && include.empty()) {
      auto inc = python_include(python);
      if (!inc) return inc.error();
      include = *inc;
    }
  std::string output = dir + "/" + base_name(bf.path);
  std::vector<std::string> argv;
  for (const auto& a : bf.build) {
    if (a == "{sources}") {
      for (const auto& s : bf.sources) argv.push_back(dir + "/" + s);
      continue;
    }
    std::string x = a;
    for (auto [key, val] : {std::pair<std::string, std::string>{"{python_include}", include}, {"{output}", output}}) {
      for (size_t p = x.find(key); p != std::string::npos; p = x.find(key, p + val.size())) x.replace(p, key.size(), val);
    }
    argv.push_back(x);
  }
  auto r = run(argv, dir);
  if (!r) return r.error();
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (r->first != 0) {
    Error e = make_error(ErrorKind::Compile, bf.path,
                         "rebuilding from the patched sources failed (" + argv[0] + " exit " + std::to_string(r->first) + ")");
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    e.details = {"  $ " + cmd};
    for (auto& l : last_lines(r->second, 20)) e.details.push_back(std::move(l));
    return e;
  }
  std::ifstream in(output, std::ios::binary);
  if (!in) return make_error(ErrorKind::Compile, bf.path, "the build command wrote no " + base_name(bf.path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<Change> apply_changes(const BuiltFile& bf, const std::string& overlay, const FileData& original,
                                  const std::string& new_bytes) {
  Change backup = create_change(backup_path(bf.path), original.bytes);
  backup.mode = original.st.st_mode & 07777;
  Change record = create_change(record_path(bf.path),
                                format_record(Record{overlay, kvtier::sha256_hex(original.bytes), kvtier::sha256_hex(new_bytes)}));
  // The backup and the record first: a crash after the commit point rolls all three forward.
  return {backup, record, write_change(bf.path, original, new_bytes)};
}

Result<std::vector<Change>> revert_changes(const Tree& tree, const BuiltFile& bf, const FileState& fs) {
  auto backup = tree.read(backup_path(bf.path));
  if (!backup) return backup.error();
  if (!backup->has_value()) return make_error(ErrorKind::Tampered, bf.path, "the original binary's backup is gone");
  auto record = tree.read(record_path(bf.path));
  if (!record) return record.error();
  if (!record->has_value()) return make_error(ErrorKind::Tampered, bf.path, "the overlay record is gone");
  return std::vector<Change>{write_change(bf.path, fs.data, (*backup)->bytes),
                             delete_change(backup_path(bf.path), kvtier::sha256_hex((*backup)->bytes)),
                             delete_change(record_path(bf.path), kvtier::sha256_hex((*record)->bytes))};
}

}  // namespace patcher::built
