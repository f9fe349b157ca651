// The node a simulated backend pretends to be, written as a spec string:
//   8xH100            eight H100s
//   4xH100+4xA10      a mixed node (devices numbered in the order written)
//   2xH200:40GiB      with a memory size per device (GiB, GB, MiB or MB)
//   8xH100@a100-nvswitch   the platform whose collective times the model predicts (NOTE
//                     [The collective model]): a name or a platform file's path
// Types are case-insensitive and normalised through backend/gpu_type.h.
#pragma once

#include <string>
#include <string_view>

#include "backend/backend.h"

namespace sgpu::sim {

inline constexpr std::string_view kDefaultNodeSpec = "8xH100";

// Throws ConfigError naming the bad part of the spec and the grammar.
backend::Inventory parse_node_spec(std::string_view spec);

// The platform a simulated node's collectives are predicted on: the spec's "@PLATFORM",
// else SGPU_PLATFORM, else the node of its GPU type (model::default_platform_for) when
// every device has one type; "" when none applies (a mixed node, a type with no node).
// Throws ConfigError when the named platform does not load.
std::string platform_of_spec(std::string_view spec);

}  // namespace sgpu::sim
