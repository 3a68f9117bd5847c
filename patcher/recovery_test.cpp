// Recovery never destroys work (issue 13): an interrupted transaction is
// verified whole before anything is renamed, a file someone changed is never
// overwritten, `overlay recover --discard` is the way out, status shows every
// leftover, what can be checked before the commit point is, and a reader that
// meets a transaction in progress says so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kKilled = 99;

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

Snapshot pristine_tree() {
  Workspace w;
  return snapshot(w.tree);
}

TEST(Recovery, AHandEditAfterTheCommitPointIsNeverOverwritten) {
  Workspace w;
  // Killed after the commit point, before the first rename.
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "rename:1"}}).code, kKilled);
  std::string hotfix = read_file(w.tree_file("example/scheduler.py")) + "# hotfix\n";
  write_file(w.tree_file("example/scheduler.py"), hotfix);
  auto before = snapshot(w.tree);
  for (const char* cmd : {"apply", "revert", "recover"}) {
    auto r = w.run({cmd});
    EXPECT_EQ(r.code, 4) << cmd << r.err;
    EXPECT_THAT(r.err, HasSubstr("example/scheduler.py"));
    EXPECT_THAT(r.err, HasSubstr("overlay recover --discard"));
    EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "") << cmd;  // nothing renamed, nothing removed
  }
  auto st = w.run({"status"});
  EXPECT_EQ(st.code, 0);
  EXPECT_THAT(st.out, HasSubstr("cannot be finished"));
  EXPECT_THAT(st.out, HasSubstr("problem: example/scheduler.py: changed since"));
  // The way out keeps the hotfix and rolls the rest back.
  auto d = w.run({"recover", "--discard"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("kept example/scheduler.py"));
  EXPECT_EQ(read_file(w.tree_file("example/scheduler.py")), hotfix);
  EXPECT_FALSE(exists(w.tree + "/.overlay-journal"));
  Snapshot want = pristine_tree(), now = snapshot(w.tree);
  want.erase("example/scheduler.py");
  now.erase("example/scheduler.py");
  EXPECT_EQ(diff_bytes(want, now), "");
}

TEST(Recovery, ADamagedTempRefusesBeforeTheFirstRename) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "rename:1"}}).code, kKilled);
  // The first file's temp is fine, the second one's is damaged: the old engine
  // renamed the first, then stopped.
  write_file(w.tree_file("example/.worker.py.overlay-tmp"), "damaged\n");
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("example/worker.py"));
  EXPECT_THAT(r.err, HasSubstr("damaged"));
  EXPECT_THAT(r.err, HasSubstr("nothing was changed"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  EXPECT_EQ(w.run({"revert"}).code, 4);
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  ASSERT_EQ(w.run({"recover", "--discard"}).code, 0);
  EXPECT_EQ(diff_bytes(pristine_tree(), snapshot(w.tree)), "");
  EXPECT_EQ(w.run({"apply"}).code, 0);
  EXPECT_EQ(w.run({"check"}).code, 0);
}

TEST(Recovery, DiscardAfterSomeRenamesRestoresTheOldBytes) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}).code, 0);
  Snapshot applied = snapshot(w.tree);
  // A revert killed after two of its changes: both files carry the
  // transaction's new bytes; discard must bring back the applied bytes.
  ASSERT_EQ(w.run({"revert"}, {{"OVERLAY_FAULT", "rename:3"}}).code, kKilled);
  EXPECT_NE(diff_bytes(applied, snapshot(w.tree)), "");
  auto d = w.run({"recover", "--discard"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("restored example/scheduler.py"));
  EXPECT_EQ(diff_bytes(applied, snapshot(w.tree)), "");
  EXPECT_EQ(w.run({"check"}).code, 0);
}

// Killed while removing the saved old bytes, after every rename: the tree is
// applied, the journal still there. Discarding would put back only the files
// whose old bytes were still saved (hostile-test finding), so it refuses and
// recover finishes the transaction.
TEST(Recovery, DiscardAfterTheCleanupBeganRefusesAndRecoverFinishes) {
  for (const char* cmd : {"apply", "revert"}) {
    Workspace w;
    if (std::string(cmd) == "revert") ASSERT_EQ(w.run({"apply"}).code, 0);
    ASSERT_EQ(w.run({cmd}, {{"OVERLAY_FAULT", "unlink-saved:2"}}).code, kKilled) << cmd;
    ASSERT_TRUE(exists(w.tree + "/.overlay-journal"));
    auto before = snapshot(w.tree);
    auto d = w.run({"recover", "--discard"});
    EXPECT_EQ(d.code, 4) << cmd << d.out << d.err;
    EXPECT_THAT(d.err, HasSubstr("half-applied"));
    EXPECT_THAT(d.err, HasSubstr("overlay recover --root"));
    EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "") << cmd;
    ASSERT_EQ(w.run({"recover"}).code, 0) << cmd;
    EXPECT_FALSE(exists(w.tree + "/.overlay-journal"));
    EXPECT_EQ(w.run({"check", "--expect", std::string(cmd) == "apply" ? "applied" : "pristine"}).code, 0) << cmd;
  }
}

// Issue 37: killed after every change was in place (only the journal left),
// then a target edited by hand: the transaction cannot be finished (the edit
// blocks it) and cannot be rolled back whole (the saved old bytes are gone).
// Discard went ahead anyway, removed the new module and left the importers
// patched (exit 0). It must refuse, name the edited file, and change nothing.
TEST(Recovery, DiscardThatCannotBeWholeRefusesEvenWhenAHandEditBlocksFinishing) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "journal-remove:1"}}).code, kKilled);
  ASSERT_TRUE(exists(w.tree + "/.overlay-journal"));
  write_file(w.tree_file("example/worker.py"), read_file(w.tree_file("example/worker.py")) + "# hotfix\n");
  auto before = snapshot(w.tree);
  auto d = w.run({"recover", "--discard"});
  EXPECT_EQ(d.code, 4) << d.out << d.err;
  EXPECT_THAT(d.err, HasSubstr("half-applied"));
  EXPECT_THAT(d.err, HasSubstr("nothing was changed"));
  EXPECT_THAT(d.err, HasSubstr("example/worker.py: changed since"));  // the file that blocks finishing
  EXPECT_THAT(d.err, HasSubstr("example/scheduler.py: its saved old bytes"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
  EXPECT_TRUE(exists(w.tree_file("example/cache_hooks.py")));
  // Undoing the edit makes it finishable, as the message says.
  write_file(w.tree_file("example/worker.py"),
             read_file(w.tree_file("example/worker.py")).substr(0, before["example/worker.py"].bytes.size() - 9));
  ASSERT_EQ(w.run({"recover"}).code, 0);
  EXPECT_EQ(w.run({"check"}).code, 0);
}

// Issue 45: the twin of the case above. Killed after a target got its new
// bytes (every rename done, the saved old bytes still there), then that
// target edited: discard kept it, removed the new module it imports and the
// only saved copy of its old bytes (exit 0). It must refuse, name the file,
// change nothing and keep the saved old bytes; with the edit undone it rolls
// the transaction back whole.
TEST(Recovery, DiscardRefusesWhenAFileHoldingItsNewBytesWasEdited) {
  for (const char* fault : {"unlink-saved:1", "rename:3"}) {
    Workspace w;
    Snapshot pristine = snapshot(w.tree);
    ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", fault}}).code, kKilled) << fault;
    const std::string target = "example/scheduler.py";
    const std::string saved = "example/.scheduler.py.overlay-old";
    ASSERT_NE(read_file(w.tree_file(target)), pristine[target].bytes) << fault << ": not renamed yet";
    ASSERT_TRUE(exists(w.tree_file(saved))) << fault;
    const std::string applied = read_file(w.tree_file(target));
    write_file(w.tree_file(target), applied + "# hotfix\n");
    auto before = snapshot(w.tree);
    auto d = w.run({"recover", "--discard"});
    EXPECT_EQ(d.code, 4) << fault << d.out << d.err;
    EXPECT_THAT(d.err, HasSubstr(target + ": edited after the interrupted transaction gave it its new bytes"));
    EXPECT_THAT(d.err, HasSubstr("nothing was changed"));
    EXPECT_THAT(d.err, HasSubstr("overlay recover --discard"));
    EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "") << fault;
    EXPECT_TRUE(exists(w.tree_file(saved))) << fault;
    auto r = w.run({"recover"});  // finishing is blocked by the same edit
    EXPECT_EQ(r.code, 4) << fault;
    EXPECT_THAT(r.err, HasSubstr("give " + target + " the bytes the transaction wrote (undo the edit)")) << r.err;
    EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "") << fault;
    write_file(w.tree_file(target), applied);
    auto again = w.run({"recover", "--discard"});
    ASSERT_EQ(again.code, 0) << fault << again.err;
    EXPECT_EQ(diff_bytes(pristine, snapshot(w.tree)), "") << fault;
  }
}

// Issue 37: a damaged saved copy was reported as "already removed" with
// "every change in place", though the transaction had stopped half-way.
TEST(Recovery, DiscardWithADamagedSavedCopySaysSoAndNotThatEveryChangeIsInPlace) {
  Workspace w;
  Snapshot pristine = snapshot(w.tree);
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "rename:2"}}).code, kKilled);  // one change in place
  std::string renamed;
  for (const char* f : {"example/scheduler.py", "example/worker.py"})
    if (read_file(w.tree_file(f)) != pristine[f].bytes) renamed = f;
  ASSERT_FALSE(renamed.empty());
  std::string saved = renamed.substr(0, renamed.rfind('/') + 1) + "." + renamed.substr(renamed.rfind('/') + 1) +
                      ".overlay-old";
  ASSERT_TRUE(exists(w.tree_file(saved)));
  write_file(w.tree_file(saved), "damaged\n");
  auto before = snapshot(w.tree);
  auto d = w.run({"recover", "--discard"});
  EXPECT_EQ(d.code, 4) << d.out << d.err;  // the refusal itself was right
  EXPECT_THAT(d.err, HasSubstr(renamed + ": its saved old bytes " + saved + " are damaged"));
  EXPECT_THAT(d.err, Not(HasSubstr("already removed")));
  EXPECT_THAT(d.err, Not(HasSubstr("every change in place")));
  EXPECT_THAT(d.err, HasSubstr("overlay recover --root"));  // finishing still works
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");
}

// Issue 37: a failure to save the old bytes was ignored (exit 0), and that
// transaction could not be discarded. It fails before the commit point.
TEST(Recovery, AFailureToSaveTheOldBytesFailsBeforeTheCommitPoint) {
  for (const char* cmd : {"apply", "revert"}) {
    Workspace w;
    if (std::string(cmd) == "revert") {
      ASSERT_EQ(w.run({"apply"}).code, 0);
    }
    auto before = snapshot(w.tree);
    auto r = w.run({cmd}, {{"OVERLAY_FAULT", "EIO@link-old"}});
    EXPECT_EQ(r.code, 6) << cmd << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("cannot save its old bytes"));
    EXPECT_THAT(r.err, HasSubstr("Input/output error"));
    EXPECT_FALSE(exists(w.tree + "/.overlay-journal")) << cmd;
    EXPECT_EQ(diff_snapshots(before, snapshot(w.tree), /*dir_mtimes=*/false), "") << cmd;
  }
}

// A journal cut short can be neither finished nor discarded: the advice must
// not send the user to a --discard that refuses too.
TEST(Recovery, ACorruptJournalGivesAdviceThatWorks) {
  Workspace w;
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "rename:1"}}).code, kKilled);
  std::string journal = w.tree + "/.overlay-journal";
  ASSERT_EQ(::truncate(journal.c_str(), 40), 0);
  auto r = w.run({"recover"});
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_THAT(r.err, HasSubstr("reinstall the engine wheel"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("recover --discard")));
  EXPECT_EQ(w.run({"recover", "--discard"}).code, 4);
}

TEST(Recovery, KillDuringDiscardThenDiscardAgainConverges) {
  Workspace probe;
  ASSERT_EQ(probe.run({"apply"}, {{"OVERLAY_FAULT", "rename:3"}}).code, kKilled);
  auto steps = fault_steps(probe, {"recover", "--discard"});
  ASSERT_FALSE(steps.empty());
  for (const auto& s : steps) {
    Workspace w;
    ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "rename:3"}}).code, kKilled);
    ASSERT_EQ(w.run({"recover", "--discard"}, {{"OVERLAY_FAULT", s.spec()}}).code, kKilled) << s.spec();
    EXPECT_EQ(w.run({"status"}).code, 0) << s.spec();
    auto d = w.run({"recover", "--discard"});
    ASSERT_EQ(d.code, 0) << s.spec() << d.err;
    EXPECT_EQ(diff_bytes(pristine_tree(), snapshot(w.tree)), "") << s.spec();
  }
}

TEST(Recovery, StatusShowsEveryLeftoverAndItsFate) {
  Workspace w;
  // Killed between writing the journal and committing it.
  ASSERT_EQ(w.run({"apply"}, {{"OVERLAY_FAULT", "journal-commit"}}).code, kKilled);
  ASSERT_TRUE(exists(w.tree + "/.overlay-journal.tmp"));
  auto st = w.run({"status", "--json"});
  ASSERT_EQ(st.code, 0) << st.err;
  auto j = status_state(st.out);
  std::set<std::string> reported;
  for (const auto& l : j["leftovers"]) {
    reported.insert(l["path"].get<std::string>());
    EXPECT_FALSE(l["fate"].get<std::string>().empty());
  }
  // Every leftover on disk (journal temp, temps, saved old bytes) is listed.
  for (const auto& [path, e] : snapshot(w.tree)) {
    bool ours = path.find(".overlay-") != std::string::npos && path.find(".overlay-dir") == std::string::npos;
    if (ours) {
      EXPECT_TRUE(reported.count(path)) << path;
    }
  }
  EXPECT_TRUE(reported.count(".overlay-journal.tmp"));
  auto text = w.run({"status"});
  EXPECT_THAT(text.out, HasSubstr("leftover journal temp .overlay-journal.tmp: a journal that was never committed"));
  // And the next apply removes them all.
  ASSERT_EQ(w.run({"apply"}).code, 0);
  for (const auto& [path, e] : snapshot(w.tree)) EXPECT_EQ(path.find(".overlay-journal"), std::string::npos) << path;
}

TEST(Recovery, AnImmutableTargetIsRefusedBeforeTheCommitPoint) {
  Workspace w;
  std::string target = w.tree_file("example/worker.py");
  if (run_process({"/usr/bin/chattr", "+i", target}, {}).code != 0) GTEST_SKIP() << "no chattr +i here";
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"});
  run_process({"/usr/bin/chattr", "-i", target}, {});
  EXPECT_EQ(r.code, 6) << r.err;
  EXPECT_THAT(r.err, HasSubstr("example/worker.py"));
  EXPECT_THAT(r.err, HasSubstr("immutable"));
  EXPECT_FALSE(exists(w.tree + "/.overlay-journal"));  // never committed, so nothing half-applied
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree), /*dir_mtimes=*/false), "");
}

TEST(Recovery, AReadOnlyFolderIsRefusedBeforeTheCommitPoint) {
  Workspace w;
  // A read-only bind mount of one folder, in a private mount namespace.
  std::string sh = "mount --bind -o ro " + w.tree + "/example " + w.tree + "/example && exec " + overlay_bin() +
                   " apply --root " + w.tree + " --manifests " + w.manifests;
  auto probe = run_process({"/usr/bin/unshare", "-m", "sh", "-c", "mount --bind -o ro / /mnt"}, {});
  if (probe.code != 0) GTEST_SKIP() << "cannot make a read-only bind mount here: " << probe.err;
  auto before = snapshot(w.tree);
  auto r = run_process({"/usr/bin/unshare", "-m", "sh", "-c", sh}, {});
  EXPECT_EQ(r.code, 6) << r.err;
  EXPECT_THAT(r.err, HasSubstr("not writable"));
  EXPECT_FALSE(exists(w.tree + "/.overlay-journal"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree), /*dir_mtimes=*/false), "");
}

TEST(Recovery, NoRoomForTheTempsIsRefusedBeforeAnyWrite) {
  Workspace w;
  auto before = snapshot(w.tree);
  auto r = w.run({"apply"}, {{"OVERLAY_FAULT", "ENOSPC@preflight-space"}});
  EXPECT_EQ(r.code, 6) << r.err;
  EXPECT_THAT(r.err, HasSubstr("not enough free space"));
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree)), "");  // not even a temp was made
}

TEST(Recovery, ReadersThatMeetATransactionInProgressSaySo) {
  Workspace w;
  int fd = ::open(w.tree.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // as a running apply holds it
  for (const char* cmd : {"check", "status", "plan"}) {
    auto r = w.run({cmd});
    EXPECT_EQ(r.code, 7) << cmd << r.err;
    EXPECT_THAT(r.err, HasSubstr("a transaction is in progress")) << cmd;
  }
  auto j = w.run({"check", "--json"});
  EXPECT_EQ(nlohmann::json::parse(j.out)["error"]["kind"], "busy");
  ::close(fd);
  EXPECT_EQ(w.run({"check", "--expect", "pristine"}).code, 0);
}

TEST(Recovery, CheckRacingApplyAndRevertNeverSaysHalfApplied) {
  Workspace w;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) (void)w.run({i % 2 ? "revert" : "apply"});
  });
  int bad = 0;
  std::string why;
  for (int i = 0; i < 60; ++i) {
    auto r = w.run({"check"});
    // applied (0), pristine (1), or busy (7); never half-applied or tampered (4)
    if (r.code != 0 && r.code != 1 && r.code != 7) {
      ++bad;
      why = r.err;
    }
  }
  stop = true;
  writer.join();
  EXPECT_EQ(bad, 0) << why;
}

}  // namespace
}  // namespace patcher::testing
