// The interface check through the CLI: an overlay's pins against an engine
// tree (the example engine, plus a module of names to pin), each way a name
// can move, and that nothing is written when one did.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char* kApi = R"(from example.worker import Worker


class Base:
    def stop(self, now: bool) -> None:
        self.stopped = now


class Engine(Base):
    limit: int = 4

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.queue: list[int] = []

    def submit(self, job_id: int, spec, *, urgent: bool = False) -> bool:
        return True

    def lookup(self, key) -> int | None:
        return None


def make_engine(worker, size: int = 1) -> Engine:
    engine = Engine(worker)
    return engine
)";

const char* kPins = R"(format = 1
overlay = "example-cache"
engine = "example"
engine_version = "1.0"

[[uses]]
kind = "module"
module = "example.engine_api"
used_by = ["cache_hooks.py:1"]

[[uses]]
kind = "name"
module = "example.engine_api"
name = "make_engine"
is = "function"
params = ["worker", "size"]
annotation = "Engine"
used_by = ["cache_hooks.py:2"]

[[uses]]
kind = "member"
module = "example.engine_api"
name = "Engine"
member = "submit"
is = "method"
params = ["job_id", "spec"]
keywords = ["urgent"]
used_by = ["cache_hooks.py:3"]

[[uses]]
kind = "member"
module = "example.engine_api"
name = "Engine"
member = "queue"
is = "attribute"
annotation = "list[int]"
used_by = ["cache_hooks.py:4"]

[[uses]]
kind = "member"
module = "example.engine_api"
name = "Engine"
member = "worker"
is = "attribute"
type = "Worker"
used_by = ["cache_hooks.py:5"]

[[uses]]
kind = "member"
module = "example.engine_api"
name = "Engine"
member = "stopped"
is = "attribute"
defined_in = "example.engine_api.Base"
used_by = ["cache_hooks.py:6"]

[[uses]]
kind = "member"
module = "example.engine_api"
name = "Engine"
member = "lookup"
is = "method"
signature = ["key"]
used_by = ["cache_hooks.py:7"]

[[uses]]
kind = "member"
module = "example.engine_api"
name = "Engine"
member = "kv_cache_meta"
present = false
used_by = ["cache_hooks.py:8"]

[[uses]]
kind = "local"
file = "example/engine_api.py"
scope = "def make_engine"
name = "engine"
used_by = ["cache_hooks.py:9"]
)";

struct ApiWorkspace : Workspace {
  ApiWorkspace() {
    write_file(tree_file("example/engine_api.py"), kApi);
    std::filesystem::create_directories(manifests + "/api");
    write_file(manifests + "/api/example-cache.toml", kPins);
  }
  void edit(const std::string& from, const std::string& to) {
    std::string t = read_file(tree_file("example/engine_api.py"));
    size_t p = t.find(from);
    ASSERT_NE(p, std::string::npos) << from;
    t.replace(p, from.size(), to);
    write_file(tree_file("example/engine_api.py"), t);
  }
};

TEST(ApiCheck, ATreeWithEveryPinnedNamePlansClean) {
  ApiWorkspace w;
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 0) << r.err;
}

struct Case {
  const char* name;
  const char* from;
  const char* to;
  const char* expect;
};

TEST(ApiCheck, EachWayANameCanMoveIsDriftNamingItAndItsUsers) {
  const Case cases[] = {
      {"module gone", nullptr, nullptr, "example.engine_api (module): module gone"},
      {"function renamed", "def make_engine(", "def build_engine(",
       "example.engine_api.make_engine (function): gone"},
      {"positional renamed", "def submit(self, job_id: int, spec,", "def submit(self, job_id: int, ptrs,",
       "parameters changed: we pass (job_id, spec) by position, it now takes (job_id, ptrs, urgent)"},
      {"keyword dropped", ", *, urgent: bool = False)", ")", "keyword urgent= we pass is no longer accepted"},
      {"attribute gone", "self.queue: list[int] = []", "self.pending: list[int] = []",
       "example.engine_api.Engine.queue (attribute): gone from class Engine"},
      {"attribute retyped", "self.queue: list[int] = []", "self.queue: deque[int] = deque()",
       "its type changed: was list[int], now deque[int]"},
      {"return type changed", "def make_engine(worker, size: int = 1) -> Engine:",
       "def make_engine(worker, size: int = 1) -> tuple[Engine, int]:",
       "its return type changed: was Engine, now tuple[Engine, int]"},
      {"type evidence gone", "def __init__(self, worker: Worker) -> None:", "def __init__(self, worker) -> None:",
       "its type changed: the definition no longer names Worker"},
      {"base member gone", "self.stopped = now", "self.halted = now",
       "example.engine_api.Engine.stopped (attribute): gone from class Engine"},
      {"override signature", "def lookup(self, key)", "def lookup(self, key, context)",
       "signature changed: we override (key), it is now (key, context)"},
      {"method became attribute", "    def lookup(self, key) -> int | None:\n        return None\n",
       "    lookup = None\n", "now a attribute, was a method"},
      {"absent name now defined", "    limit: int = 4\n", "    limit: int = 4\n    kv_cache_meta = None\n",
       "now defined (our code relies on its absence)"},
      {"local renamed", "    engine = Engine(worker)\n    return engine", "    e = Engine(worker)\n    return e",
       "no longer bound in def make_engine"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ApiWorkspace w;
    if (c.from) w.edit(c.from, c.to);
    else std::filesystem::remove(w.tree_file("example/engine_api.py"));
    Snapshot before = snapshot(w.tree);
    auto r = w.run({"plan"});
    EXPECT_EQ(r.code, 3) << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.expect));
    EXPECT_THAT(r.err, HasSubstr("interface pins"));
    EXPECT_THAT(r.err, HasSubstr("used by cache_hooks.py:"));
    auto a = w.run({"apply"});
    EXPECT_EQ(a.code, 3) << a.err;
    EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");  // nothing written
  }
}

TEST(ApiCheck, TheReportNamesTheNearestNamesNow) {
  ApiWorkspace w;
  w.edit("self.queue: list[int] = []", "self.queued: list[int] = []");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("nearest names (similarity):"));
  EXPECT_THAT(r.err, HasSubstr("queued 0.9"));
}

TEST(ApiCheck, JsonCarriesEachFindingStructured) {
  ApiWorkspace w;
  w.edit("def submit(self, job_id: int, spec,", "def submit(self, job_id: int, ptrs,");
  auto r = w.run({"plan", "--json"});
  EXPECT_EQ(r.code, 3);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["ok"]);
  bool seen = false;
  for (const auto& f : j["error"]["files"])
    for (const auto& e : f["edits"])
      if (e["kind"] == "api") {
        seen = true;
        EXPECT_EQ(f["file"], "example/engine_api.py");
        EXPECT_EQ(e["symbol"], "example.engine_api.Engine.submit");
        EXPECT_EQ(e["overlay"], "example-cache");
        EXPECT_THAT(e["problem"].get<std::string>(), HasSubstr("parameters changed"));
        EXPECT_THAT(e["now"].get<std::string>(), HasSubstr("example/engine_api.py:"));
        EXPECT_EQ(e["used_by"], nlohmann::json::array({"cache_hooks.py:3"}));
      }
  EXPECT_TRUE(seen);
}

TEST(ApiCheck, CheckOnAnAppliedTreeSeesANameThatMovedUnderIt) {
  ApiWorkspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  EXPECT_EQ(w.run({"check"}).code, 0);
  w.edit("self.queue: list[int] = []", "self.pending: list[int] = []");
  auto r = w.run({"check"});
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("Engine.queue (attribute): gone"));
  // A revert never needs the engine's names: it still takes the tree back.
  EXPECT_EQ(w.run({"revert"}).code, 0);
}

TEST(ApiCheck, AnInjectedRegionDoesNotStandInForAnEngineName) {
  ApiWorkspace w;
  w.edit("        self.queue: list[int] = []\n",
         "        # >>> overlay example-cache/x sha256=0000000000000000\n"
         "        self.queue: list[int] = []\n"
         "        # <<< overlay example-cache/x\n");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("Engine.queue (attribute): gone"));
}

TEST(ApiCheck, ABrokenPinsFileIsAUsageError) {
  ApiWorkspace w;
  write_file(w.manifests + "/api/example-cache.toml",
             "format = 1\noverlay = \"example-cache\"\n[[uses]]\nkind = \"guess\"\nmodule = \"x\"\n");
  auto r = w.run({"plan"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("api/example-cache.toml: line 3: kind = \"guess\" is not a kind of use"));
  write_file(w.manifests + "/api/example-cache.toml", "format = 1\noverlay = \"other\"\n");
  r = w.run({"plan"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("does not match the manifest's \"example-cache\""));
}

}  // namespace
}  // namespace patcher::testing
