// The node a simulated backend pretends to be, written as a spec string:
//   8xH100            eight H100s
//   4xH100+4xA10      a mixed node (devices numbered in the order written)
//   2xH200:40GiB      with a memory size per device (GiB, GB, MiB or MB)
// Types are case-insensitive and normalised through backend/gpu_type.h.
#pragma once

#include <string>
#include <string_view>

#include "backend/backend.h"

namespace sgpu::sim {

inline constexpr std::string_view kDefaultNodeSpec = "8xH100";

// Throws ConfigError naming the bad part of the spec and the grammar.
backend::Inventory parse_node_spec(std::string_view spec);

}  // namespace sgpu::sim
