// A folder of overlay manifests (manifest.cpp parses each): every *.toml,
// checked against each other (one engine version, agreeing pins, no new file
// claimed twice) and put in stacking order (ORDER, or `after`).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>
#include <stdexcept>

#include "fd.h"
#include "manifest.h"
#include "paths.h"
#include "text.h"

namespace patcher {

const Manifest* ManifestSet::find(const std::string& name) const {
  auto it = std::ranges::find(overlays, name, &Manifest::overlay);
  return it == overlays.end() ? nullptr : &*it;
}

const Manifest& ManifestSet::get(const std::string& name) const {
  const Manifest* m = find(name);
  if (!m) throw std::logic_error("ManifestSet::get: unknown overlay " + name);
  return *m;
}

namespace {

// A manifest or ORDER file: a regular file (O_NONBLOCK so a FIFO cannot
// hang the open; fstat refuses it and a device such as /dev/zero) of at most
// kMaxManifestBytes. A symlink to a regular file is fine: anchors folders
// are often linked into place.
Result<std::string> read_small_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorKind::Io, path, "cannot read: " + errno_text(errno));
  kvtier::Fd guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(ErrorKind::Io, path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return make_error(ErrorKind::Usage, path, "not a regular file");
  if (st.st_size > static_cast<off_t>(kMaxManifestBytes))
    return make_error(ErrorKind::Usage, path,
                      "manifest is " + std::to_string(st.st_size) + " bytes; at most " +
                          std::to_string(kMaxManifestBytes) + " are read");
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return make_error(ErrorKind::Io, path, "cannot read: " + errno_text(errno));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

}  // namespace

Result<ManifestSet> load_manifests(const std::string& dir, const std::string& fragments_root) {
  ManifestSet set;
  set.dir = dir;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return make_error(ErrorKind::Usage, dir, "manifests folder cannot be opened: " + errno_text(errno));
  std::vector<std::string> names;
  while (dirent* ent = ::readdir(d)) {
    std::string n = ent->d_name;
    if (n.size() > 5 && n.substr(n.size() - 5) == ".toml") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  if (names.empty()) return make_error(ErrorKind::Usage, dir, "no *.toml manifests in this folder");
  std::vector<Manifest> loaded;
  for (const auto& n : names) {
    std::string path = dir + "/" + n;
    auto text = read_small_file(path);
    if (!text) return text.error();
    std::string stem = n.substr(0, n.size() - 5);
    auto m = parse_manifest(*text, path, fragments_root + "/" + stem);
    if (!m) return m.error();
    if (m->overlay != stem)
      return make_error(ErrorKind::Usage, path,
                        "line " + std::to_string(m->overlay_line) + ": overlay = \"" + m->overlay +
                            "\" does not match the file name \"" + n + "\"");
    std::string api_path = dir + "/api/" + n;
    struct stat api_st {};
    if (::stat(api_path.c_str(), &api_st) == 0) {
      auto api_text = read_small_file(api_path);
      if (!api_text) return api_text.error();
      auto api = parse_api_pins(*api_text, api_path, m->overlay);
      if (!api) return api.error();
      m->api = std::move(*api);
    }
    loaded.push_back(std::move(*m));
  }
  std::map<std::string, const Manifest*> by_name;
  for (const auto& m : loaded) by_name[m.overlay] = &m;
  for (const auto& m : loaded) {
    if (m.engine != loaded[0].engine || m.engine_version != loaded[0].engine_version)
      return make_error(ErrorKind::Usage, m.file,
                        "engine " + m.engine + " " + m.engine_version + " differs from " + loaded[0].file + " (" +
                            loaded[0].engine + " " + loaded[0].engine_version + ")");
    for (const auto& a : m.after)
      if (!by_name.count(a))
        return make_error(ErrorKind::Usage, m.file,
                          "line " + std::to_string(m.after_line) + ": \"after\" names unknown overlay \"" + a + "\"");
  }
  // Same target in two overlays: the pins must agree; a new file may not be
  // another overlay's target or new file.
  std::map<std::string, std::pair<std::string, const Manifest*>> pins;
  std::map<std::string, const Manifest*> news;
  for (const auto& m : loaded) {
    for (const auto& f : m.files) {
      auto it = pins.find(f.path);
      if (it != pins.end() && it->second.first != f.sha256)
        return make_error(ErrorKind::Usage, m.file,
                          "sha256 pin of \"" + f.path + "\" differs from the one in " + it->second.second->file);
      pins.emplace(f.path, std::pair{f.sha256, &m});
    }
    for (const auto& nf : m.new_files) {
      if (news.count(nf.path))
        return make_error(ErrorKind::Usage, m.file,
                          "new file \"" + nf.path + "\" is also a new file of " + news[nf.path]->file);
      news[nf.path] = &m;
    }
  }
  for (const auto& [p, m] : news)
    if (pins.count(p))
      return make_error(ErrorKind::Usage, m->file,
                        "new file \"" + p + "\" is an edited target of " + pins[p].second->file);
  // Stacking order.
  std::vector<std::string> order;
  std::string order_path = dir + "/ORDER";
  struct stat st {};
  if (::stat(order_path.c_str(), &st) == 0) {
    auto text = read_small_file(order_path);
    if (!text) return text.error();
    std::set<std::string> seen;
    for (const auto& raw : split_lines(*text).lines) {
      std::string_view l = trim(raw);
      if (l.empty() || l[0] == '#') continue;
      std::string name(l);
      if (!by_name.count(name))
        return make_error(ErrorKind::Usage, order_path, "names overlay \"" + name + "\" that has no manifest");
      if (!seen.insert(name).second)
        return make_error(ErrorKind::Usage, order_path, "lists overlay \"" + name + "\" twice");
      for (const auto& a : by_name[name]->after)
        if (!seen.count(a))
          return make_error(ErrorKind::Usage, order_path,
                            "puts \"" + name + "\" before \"" + a + "\", but " + name + " has after = [\"" + a + "\"]");
      order.push_back(name);
    }
    for (const auto& [name, m] : by_name)
      if (!seen.count(name))
        return make_error(ErrorKind::Usage, order_path, "does not list overlay \"" + name + "\"");
  } else {
    std::set<std::string> done;
    while (order.size() < loaded.size()) {
      bool progressed = false;
      for (const auto& [name, m] : by_name) {  // map: ties broken by name
        if (done.count(name)) continue;
        bool ready = std::all_of(m->after.begin(), m->after.end(), [&](auto& a) { return done.count(a) > 0; });
        if (!ready) continue;
        order.push_back(name);
        done.insert(name);
        progressed = true;
        break;
      }
      if (!progressed) {
        for (const auto& [name, m] : by_name)
          if (!done.count(name))
            return make_error(ErrorKind::Usage, m->file, "\"after\" forms a cycle through \"" + name + "\"");
      }
    }
  }
  for (const auto& name : order)
    for (auto& m : loaded)
      if (m.overlay == name) set.overlays.push_back(std::move(m));
  return set;
}

}  // namespace patcher
