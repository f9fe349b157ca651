// Prints what every backend of this build sees on this node.
//   build/bin/inventory
#include <iostream>

#include "backend/backend_table.h"
#include "sgpu/sgpu.h"

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  for (const auto& entry : sgpu::backend::backend_table()) {
    const auto inventory = sgpu::backend::find_backend(entry.name).inventory(sgpu::Options{});
    std::cout << entry.name << ": " << inventory.summary();
    if (inventory.gpus.empty()) std::cout << " (" << inventory.unavailable_reason << ")";
    std::cout << "\n";
    for (const auto& gpu : inventory.gpus) {
      std::cout << "  " << gpu.index << ": " << gpu.type << "  " << gpu.name << "  "
                << (gpu.memory_bytes >> 30) << " GiB\n";
    }
  }
}
