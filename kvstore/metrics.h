// kvstore's node-exporter textfiles (docs/DEPLOY.md, "Metrics"): one file
// per command, every series always present (zero when zero), timestamps
// instead of ages, and per command the last run, its exit code and the last
// success, carried over from the previous file when this run failed.
// Part of the kvstore CLI layer (kvstore's alone, so beside its main.cpp and
// not in the shared cli/): rendering only, no I/O but reading the previous
// file.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/kvstore/gc.h"
#include "kvtier/kvstore/report.h"
#include "kvtier/kvstore/stat.h"

namespace kvstore_cli {

struct RunInfo {
  std::string command;  // verify, gc, stat
  int exit_code = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  double last_success_s = 0;  // this run's end when it succeeded, else the previous file's value
};

// The kvstore_last_success_timestamp_seconds{command="..."} value of an
// existing textfile, 0 when there is none.
double previous_last_success(const std::string& path, const std::string& command);

// Each takes null when the command failed before it had a result: the run
// series are still written, the command's series are zero.
std::string verify_metrics(const kvstore::ScanSummary* summary, const RunInfo& run);
std::string gc_metrics(const kvstore::GcReport* report, const kvstore::ScanSummary* summary, const RunInfo& run);
std::string stat_metrics(const kvstore::StoreStats* stats, const RunInfo& run);

}  // namespace kvstore_cli
