// The device memory figures a rank leaves at its end (rank-<N>/memory.json): its
// sgpu::MemoryStats as one JSON object, {"allocated_bytes.all.peak": 1048576, ...}.
#pragma once

#include <filesystem>
#include <optional>

#include "sgpu/memory.h"

namespace sgpu::serialize {

void write_memory_record(const std::filesystem::path& path, const MemoryStats& stats);
// std::nullopt when the file is missing or is not such an object.
std::optional<MemoryStats> read_memory_record(const std::filesystem::path& path);

}  // namespace sgpu::serialize
