// The engine as a library (no subprocess): apply, check, revert and recover
// through Session, and fault injection through the FaultHook interface a test
// provides, which is how crash tests reach every step without a hook in the
// production binary.
#include "engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
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
