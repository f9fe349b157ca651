// Step 3 of a call: does the node serve the request? Pure function of the inventory.
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"

namespace sgpu::backend {

// How to choose `backend`, as advice in a message: "pass backend=\"sim\"" as `front_end`
// spells it, or, where SGPU_BACKEND decides whatever the option says, "set
// SGPU_BACKEND=sim (...)".
std::string backend_advice(std::string_view backend, FrontEnd front_end);

struct Selection {
  std::string gpu_type;             // requested, or detected when the request had none
  std::vector<int> device_indices;  // local rank i runs on device_indices[i]
};

// Throws AcceleratorMismatchError saying what was asked, what the node has and what to
// change (as `front_end` spells the settings): unknown type, a type the node lacks, more GPUs
// than the node (or the type) has.
Selection select_devices(const Inventory& inventory, int gpus, const std::string& gpu_type,
                         std::string_view backend_name, FrontEnd front_end);

}  // namespace sgpu::backend
