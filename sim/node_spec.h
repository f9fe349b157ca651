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
#include <vector>

#include "backend/backend.h"

namespace sgpu::sim {

inline constexpr std::string_view kDefaultNodeSpec = "8xH100";

// Throws ConfigError naming the bad part of the spec and the grammar.
backend::Inventory parse_node_spec(std::string_view spec);

// The GPUs of `node` that a process sees under CUDA_VISIBLE_DEVICES=`visible`, as CUDA
// reads it: a comma-separated list of device indices or UUIDs ("GPU-" and a unique prefix
// of the UUID torch.cuda.get_device_properties() gives a simulated GPU), in the order
// written and numbered from 0 in that order. The list ends at the first entry that names no
// device (`0,2,-1,1` sees devices 0 and 2); a device named twice, or an empty list, leaves
// none. `visible` null (the variable unset) sees them all.
backend::Inventory visible_devices(backend::Inventory node, const char* visible);

// The node's indices of the GPUs visible_devices() leaves of `count`, in their new order.
std::vector<int> visible_indices(int count, const char* visible);

// parse_node_spec(spec) as this process sees it (visible_devices under its
// CUDA_VISIBLE_DEVICES).
backend::Inventory visible_node(std::string_view spec);

// The platform a simulated node's collectives are predicted on: the spec's "@PLATFORM",
// else SGPU_PLATFORM, else the node of its GPU type (model::default_platform_for) when
// every device has one type; "" when none applies (a mixed node, a type with no node).
// Throws ConfigError when the named platform does not load.
std::string platform_of_spec(std::string_view spec);

}  // namespace sgpu::sim
