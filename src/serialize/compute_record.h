// The compute estimate a rank leaves at its end (rank-<N>/compute.json): its
// sgpu::ComputeStats as one JSON object,
// {"platform": "h100-nvswitch", "ops": {"aten.mm": {"count": 12, "flops": 1.2e12,
//  "bytes": 3.4e9, "predicted_seconds": 0.0012}, ...}}.
#pragma once

#include <filesystem>
#include <optional>

#include "sgpu/compute.h"

namespace sgpu::serialize {

void write_compute_record(const std::filesystem::path& path, const ComputeStats& stats);
// std::nullopt when the file is missing or is not such an object.
std::optional<ComputeStats> read_compute_record(const std::filesystem::path& path);

}  // namespace sgpu::serialize
