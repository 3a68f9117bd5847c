// The engine as a library (no subprocess): apply, check, revert and recover
// through Session, and fault injection through the FaultHook interface a test
// provides, which is how crash tests reach every step without a hook in the
// production binary.
#include "engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "fault.h"
#include "test_util.h"

namespace patcher::testing {
namespace {

using ::testing::HasSubstr;

Session open_session(const Workspace& w) {
  auto set = load_manifests(w.manifests, w.overlays);
  EXPECT_TRUE(set.ok()) << set.error().line();
  auto tree = Tree::open(w.tree);
  EXPECT_TRUE(tree.ok());
  return Session{std::move(*tree), std::move(*set), ""};
}

// Fails the I/O of one step, the n-th time it is reached.
class FailStep : public FaultHook {
 public:
  FailStep(std::string step, int nth, int err) : step_(std::move(step)), nth_(nth), err_(err) {}
  int at(const char* step) override { return step_ == step && ++seen_ == nth_ ? err_ : 0; }

 private:
  std::string step_;
  int nth_, err_, seen_ = 0;
};

struct HookGuard {
  explicit HookGuard(FaultHook* h) { set_fault_hook(h); }
  ~HookGuard() { set_fault_hook(nullptr); }
};

TEST(Engine, ApplyCheckRevertRoundTrip) {
  Workspace w;
  Snapshot pristine = snapshot(w.tree);
  Session s = open_session(w);
  Request r;
  auto plan = plan_apply(s, r);
  ASSERT_TRUE(plan.ok()) << plan.error().line();
  EXPECT_EQ(diff_snapshots(pristine, snapshot(w.tree)), "");  // a plan writes nothing
  EXPECT_EQ(plan->changes.size(), 4u);
  auto a = apply(s, r);
  ASSERT_TRUE(a.ok()) << a.error().line();
  EXPECT_TRUE(check(s, r).ok());
  Request pr;
  pr.expect_pristine = true;
  auto c = check(s, pr);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().kind, ErrorKind::NotExpected);
  ASSERT_TRUE(revert(s, r).ok());
  EXPECT_EQ(diff_bytes(pristine, snapshot(w.tree)), "");
  EXPECT_TRUE(check(s, pr).ok());
}

TEST(Engine, AFailedRenameAfterTheCommitPointIsFinishedByRecover) {
  Workspace w;
  Session s = open_session(w);
  Request r;
  {
    FailStep hook("rename", 2, EIO);
    HookGuard g(&hook);
    auto a = apply(s, r);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().kind, ErrorKind::Io);
    EXPECT_THAT(a.error().message, HasSubstr("journal kept"));
  }
  EXPECT_EQ(::access((w.tree + "/.overlay-journal").c_str(), F_OK), 0);
  auto st = status(s);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->state.journal);
  EXPECT_TRUE(st->state.journal_problems.empty());
  auto rec = recover_tree(s, /*discard=*/false);
  ASSERT_TRUE(rec.ok()) << rec.error().line();
  EXPECT_TRUE(rec->had_journal);
  EXPECT_TRUE(check(s, r).ok());
}

TEST(Engine, AFailureBeforeTheCommitPointLeavesTheTreeAsItWas) {
  Workspace w;
  Snapshot before = snapshot(w.tree);
  Session s = open_session(w);
  FailStep hook("temp-fsync", 2, ENOSPC);
  HookGuard g(&hook);
  auto a = apply(s, Request{});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().kind, ErrorKind::Io);
  EXPECT_EQ(diff_snapshots(before, snapshot(w.tree), /*dir_mtimes=*/false), "");
}

// Where the file system has no hard links (link fails with EPERM), the old
// bytes are copied instead, so the transaction can still be rolled back.
class NoHardLinks : public FaultHook {
 public:
  int at(const char* step) override {
    if (std::string(step) == "link-old") return EPERM;
    if (std::string(step) == "rename" && ++renames_ == 2) return EIO;  // stop after the commit point
    return 0;
  }

 private:
  int renames_ = 0;
};

TEST(Engine, WithoutHardLinksTheOldBytesAreCopiedAndDiscardRestoresThem) {
  Workspace w;
  Snapshot pristine = snapshot(w.tree);
  Session s = open_session(w);
  {
    NoHardLinks hook;
    HookGuard g(&hook);
    auto a = apply(s, Request{});
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().kind, ErrorKind::Io);
  }
  for (const char* f : {"example/scheduler.py", "example/worker.py"}) {
    std::string saved = w.tree + "/example/." + std::string(f).substr(8) + ".overlay-old";
    struct stat st {};
    ASSERT_EQ(::stat(saved.c_str(), &st), 0) << saved;
    EXPECT_EQ(st.st_nlink, 1u) << saved;  // a copy, not a link
    EXPECT_EQ(read_file(saved), pristine[f].bytes) << saved;
  }
  auto d = recover_tree(s, /*discard=*/true);
  ASSERT_TRUE(d.ok()) << d.error().line();
  EXPECT_EQ(diff_bytes(pristine, snapshot(w.tree)), "");
}

// Appends a line to one file the n-th time a step is reached: another process
// editing a target while apply or revert runs (the lock keeps only other
// `overlay` runs out).
class EditAtStep : public FaultHook {
 public:
  EditAtStep(std::string step, int nth, std::string path) : step_(std::move(step)), nth_(nth), path_(std::move(path)) {}
  int at(const char* step) override {
    if (step_ == step && ++seen_ == nth_) {
      write_file(path_, read_file(path_) + kEdit);
      fired = true;
    }
    return 0;
  }
  static constexpr const char* kEdit = "# edited by another process\n";
  bool fired = false;

 private:
  std::string step_;
  int nth_, seen_ = 0;
  std::string path_;
};

// Issue 37: a line appended to a target after the commit point vanished and
// apply said "applied". Each target is re-checked right before the journal
// commits and right before its own rename; a changed one is refused (Busy,
// exit 7), the transaction rolled back, the edit kept. An edit that lands
// after the file's own rename is on top of the new bytes: kept too.
TEST(Engine, AnEditByAnotherProcessDuringApplyOrRevertIsNeverLost) {
  for (const char* cmd : {"apply", "revert"}) {
    bool refused_before_commit = false, rolled_back = false;
    for (const auto& [step, nth] : std::vector<std::pair<const char*, int>>{
             {"journal-commit", 1}, {"rename", 1}, {"rename", 2}, {"rename", 3}, {"rename", 4}}) {
      SCOPED_TRACE(std::string(cmd) + " " + step + ":" + std::to_string(nth));
      Workspace w;
      Session s = open_session(w);
      if (std::string(cmd) == "revert") {
        ASSERT_TRUE(apply(s, Request{}).ok());
      }
      Snapshot before = snapshot(w.tree);
      std::string target = w.tree_file("example/worker.py");
      EditAtStep hook(step, nth, target);
      Result<OverlayReport> r = make_error(ErrorKind::Usage, "", "");
      {
        HookGuard g(&hook);
        r = std::string(cmd) == "apply" ? apply(s, Request{}) : revert(s, Request{});
      }
      if (!hook.fired) continue;  // fewer renames than that
      EXPECT_THAT(read_file(target), ::testing::EndsWith(EditAtStep::kEdit));  // never lost
      EXPECT_NE(::access((w.tree + "/.overlay-journal").c_str(), F_OK), 0);
      if (r.ok()) continue;  // the edit came after worker.py's own rename
      EXPECT_EQ(r.error().kind, ErrorKind::Busy) << r.error().line();
      EXPECT_EQ(r.error().file, "example/worker.py");
      EXPECT_THAT(r.error().message, HasSubstr("changed by another process"));
      // Everything else is as it was before the run; no leftover remains.
      Snapshot now = snapshot(w.tree);
      before.erase("example/worker.py");
      now.erase("example/worker.py");
      EXPECT_EQ(diff_bytes(before, now), "");
      if (std::string(step) == "journal-commit") {
        refused_before_commit = true;
        EXPECT_THAT(r.error().message, HasSubstr("nothing was written"));
      } else {
        rolled_back = true;
        EXPECT_THAT(r.error().message, HasSubstr("rolled back"));
      }
    }
    EXPECT_TRUE(refused_before_commit) << cmd;
    EXPECT_TRUE(rolled_back) << cmd;  // some rename came before worker.py's
  }
}

// The same while an interrupted transaction is finished (apply finishes it
// first): a file changed since it was verified is not replaced.
TEST(Engine, AnEditByAnotherProcessWhileFinishingAJournalIsNeverLost) {
  bool refused = false;
  for (int nth = 1; nth <= 4; ++nth) {
    SCOPED_TRACE("recover-rename:" + std::to_string(nth));
    Workspace w;
    Session s = open_session(w);
    {
      FailStep hook("rename", 1, EIO);  // committed, nothing renamed
      HookGuard g(&hook);
      ASSERT_FALSE(apply(s, Request{}).ok());
    }
    std::string target = w.tree_file("example/worker.py");
    EditAtStep hook("recover-rename", nth, target);
    Result<OverlayReport> r = make_error(ErrorKind::Usage, "", "");
    {
      HookGuard g(&hook);
      r = apply(s, Request{});
    }
    ASSERT_TRUE(hook.fired);
    EXPECT_THAT(read_file(target), ::testing::EndsWith(EditAtStep::kEdit));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().file, "example/worker.py");
    if (r.error().kind == ErrorKind::Tampered) continue;  // edited after it was finished: the applied file, edited
    EXPECT_EQ(r.error().kind, ErrorKind::Busy) << r.error().line();
    EXPECT_THAT(r.error().message, HasSubstr("changed by another process"));
    EXPECT_EQ(::access((w.tree + "/.overlay-journal").c_str(), F_OK), 0);  // kept for recover --discard
    refused = true;
  }
  EXPECT_TRUE(refused);
}

TEST(Engine, TheProductionBinaryHasNoFaultHook) {
  Workspace w;
  // The same variable that makes the test binary die at the first rename is
  // ignored by `overlay`: the apply completes.
  auto r = run_process({PRODUCTION_OVERLAY_BIN, "apply", "--root", w.tree, "--manifests", w.manifests},
                       {{"OVERLAY_FAULT", "rename:1"}});
  EXPECT_EQ(r.code, 0) << r.err;
  auto list = run_process({PRODUCTION_OVERLAY_BIN, "revert", "--root", w.tree, "--manifests", w.manifests},
                          {{"OVERLAY_FAULT", "list"}});
  EXPECT_EQ(list.code, 0);
  EXPECT_THAT(list.err, ::testing::Not(HasSubstr("overlay-fault-step")));
}

}  // namespace
}  // namespace patcher::testing
