#include "kvtier/kvstore/progress.h"

#include <gtest/gtest.h>

namespace kvstore {
namespace {

TEST(Progress, ScanLineCountsFilesAndFolders) {
  Progress p(false, "gc");
  EXPECT_EQ(p.line(0), "gc: 0 files in 0 folders seen");
  p.add_dirs(3);
  p.add(1200, 0);
  EXPECT_EQ(p.line(2), "gc: 1200 files in 3 folders seen");
}

TEST(Progress, VerifyLineAddsBytesReadAndRate) {
  Progress p(false, "verify");
  p.add_dirs(2);
  p.add(10, 512ULL << 20);
  EXPECT_EQ(p.line(0), "verify: 10 files in 2 folders seen, 512.0 MiB read");
  p.set_total(10, 2ULL << 30);
  EXPECT_EQ(p.line(1), "verify: 10 files in 2 folders seen, 512.0 MiB read of 2.00 GiB, 0.54 GB/s");
}

TEST(Progress, SweepLineCountsDeletionsAgainstThePlan) {
  Progress p(false, "sweep");
  p.add(500, 0);
  p.add_sweep_plan(40, 3ULL << 30);
  p.add_deleted(10, 1ULL << 30);
  EXPECT_EQ(p.line(5), "sweep: deleted 10/40 files, 1.00 GiB of 3.00 GiB freed");
  // The next rank base's plan adds to the totals; the counts go on.
  p.add_deleted(30, 2ULL << 30);
  p.add_sweep_plan(60, 1ULL << 30);
  p.add_deleted(20, 0);
  EXPECT_EQ(p.line(6), "sweep: deleted 60/100 files, 3.00 GiB of 4.00 GiB freed");
}

}  // namespace
}  // namespace kvstore
