// The figures a rank leaves at its end, each a JSON object:
// - rank-<N>/memory.json: its device's sgpu::MemoryStats, {"allocated_bytes.all.peak":
//   1048576, ...};
// - rank-<N>/compute.json: its sgpu::ComputeStats (a shape-only rank's compute estimate),
//   {"platform": "h100-nvswitch", "ops": {"aten.mm": {"count": 12, "flops": 1.2e12,
//   "bytes": 3.4e9, "predicted_seconds": 0.0012}, ...}, "exposed_collective_seconds": 0.03,
//   "steps": [{"end": 2.9, "compute_end": 2.6, "tokens": 16384, "model_flops": 7.9e14}]}.
#pragma once

#include <filesystem>
#include <optional>

#include "sgpu/compute.h"
#include "sgpu/memory.h"

namespace sgpu::serialize {

void write_memory_record(const std::filesystem::path& path, const MemoryStats& stats);
// std::nullopt when the file is missing or is not such an object.
std::optional<MemoryStats> read_memory_record(const std::filesystem::path& path);

void write_compute_record(const std::filesystem::path& path, const ComputeStats& stats);
// std::nullopt when the file is missing or is not such an object.
std::optional<ComputeStats> read_compute_record(const std::filesystem::path& path);

}  // namespace sgpu::serialize
