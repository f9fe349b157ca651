#include "sgpu/inventory.h"

#include "backend/backend_table.h"
#include "contract/option_table.h"

namespace sgpu {

std::vector<BackendInventory> inventories(const Options& given) {
  const Options options = contract::with_environment(given);  // SGPU_SIM, say
  std::vector<BackendInventory> all;
  for (const auto& entry : backend::backend_table()) {
    all.push_back({std::string(entry.name), backend::find_backend(entry.name).inventory(options)});
  }
  return all;
}

}  // namespace sgpu
