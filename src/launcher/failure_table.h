// The text of a DistributedError: the root cause first, then one row per rank, in the
// spirit of torchrun's ChildFailedError table.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "sgpu/errors.h"

namespace sgpu::launcher {

// Marks the root cause: the earliest own failure (exception, exit code, signal, bad
// result), passing over collective errors (gloo::*, c10::Dist*) a peer's death causes in
// the others, unless nothing else failed. Returns its index or -1.
int mark_root_cause(std::vector<RankFailure>& ranks);

std::string format_failure(const std::string& headline, const std::vector<RankFailure>& ranks,
                           const std::filesystem::path& run_dir);

std::string format_time(std::chrono::system_clock::time_point time);

}  // namespace sgpu::launcher
