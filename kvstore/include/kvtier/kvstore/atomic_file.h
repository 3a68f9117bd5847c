// Atomic replacement of a small text file (the Prometheus textfile): write a
// temp beside the target, fsync it, rename over the target, fsync the
// directory. node-exporter never sees a half-written file.
#pragma once

#include <string>
#include <string_view>

#include "kvtier/kvstore/error.h"

namespace kvstore {

Result<Done> write_file_atomic(const std::string& path, std::string_view content);

}  // namespace kvstore
