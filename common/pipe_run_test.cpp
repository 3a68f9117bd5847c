#include "pipe_run.h"

#include <gtest/gtest.h>

using kvtier::run_with_input;

TEST(PipeRun, EchoesLargeInputWithoutStalling) {
  // 4 MiB is far beyond a pipe's buffer: writing it all before reading would deadlock with cat.
  std::string input(4 << 20, 'x');
  auto r = run_with_input({"cat"}, input, /*search_path=*/true);
  ASSERT_TRUE(r) << r.error();
  EXPECT_TRUE(r->exited_ok());
  EXPECT_EQ(r->output.size(), input.size());
}

TEST(PipeRun, ReportsExitStatus) {
  auto r = run_with_input({"sh", "-c", "exit 3"}, "", true);
  ASSERT_TRUE(r) << r.error();
  EXPECT_FALSE(r->exited_ok());
  EXPECT_EQ(r->how_it_ended(), "exit 3");
}

TEST(PipeRun, ReportsASignal) {
  auto r = run_with_input({"sh", "-c", "kill -9 $$"}, "", true);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ(r->how_it_ended(), "signal 9");
}

TEST(PipeRun, MissingProgramIsAnError) {
  auto r = run_with_input({"/nonexistent/kvtier-no-such-tool"}, "", false);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("cannot run /nonexistent/kvtier-no-such-tool"), std::string::npos);
}
