// What a node offers: its GPUs, as each backend built into this binary sees them.
//
//   for (const auto& [backend, inventory] : sgpu::inventories()) {
//     std::cout << backend << ": " << inventory.summary() << "\n";   // "sim: 8 x H100"
//   }
//
// "cuda" reports the GPUs the driver sees (honouring CUDA_VISIBLE_DEVICES), with the
// reason when there are none; "sim" reports the node spec (Options::sim.node, else
// SGPU_SIM, else 8xH100). GPU types are normalised names: "NVIDIA H100 80GB HBM3" is
// "H100".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sgpu/options.h"

namespace sgpu {

struct Gpu {
  int index = 0;     // device index on the node
  std::string type;  // normalised, e.g. "H100"
  std::string name;  // the device's own name, e.g. "NVIDIA H100 80GB HBM3"
  std::uint64_t memory_bytes = 0;
  int capability_major = 0;  // CUDA compute capability; 0 when not known
  int capability_minor = 0;
  int multi_processor_count = 0;  // streaming multiprocessors; 0 when not known
};

struct Inventory {
  std::vector<Gpu> gpus;
  std::string unavailable_reason;  // why gpus is empty, when it is
  std::string node;                // how the node describes itself, e.g. "sim node 8xH100"
  std::string sim_spec;            // the simulated node's spec ("8xH100"); empty on a real one

  // "8 x H100", "4 x H100 + 4 x A10", "no GPU".
  std::string summary() const;
};

struct BackendInventory {
  std::string backend;  // "cuda", "sim"
  Inventory inventory;
};

// Every backend of this build, in preference order, for `options` as the SGPU_* variables
// set them (SGPU_SIM, say). Throws ConfigError for a malformed node spec or variable.
std::vector<BackendInventory> inventories(const Options& options = {});

}  // namespace sgpu
