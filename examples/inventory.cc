// Prints what every backend of this build sees on this node.
//   build/bin/inventory
#include <sgpu/sgpu.h>

#include <iostream>

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  for (const auto& [backend, inventory] : sgpu::inventories()) {
    std::cout << backend << ": " << inventory.summary();
    if (inventory.gpus.empty()) std::cout << " (" << inventory.unavailable_reason << ")";
    std::cout << "\n";
    for (const auto& gpu : inventory.gpus) {
      std::cout << "  " << gpu.index << ": " << gpu.type << "  " << gpu.name << "  "
                << (gpu.memory_bytes >> 30) << " GiB\n";
    }
  }
}
