#include "sim/sim_backend.h"

#include <cstdlib>

#include "sim/node_spec.h"

namespace sgpu::sim {

backend::Inventory SimBackend::inventory(const Options& options) const {
  std::string spec = options.sim_node;
  if (spec.empty()) {
    const char* env = std::getenv("SGPU_SIM");
    spec = (env != nullptr && *env != '\0') ? env : std::string(kDefaultNodeSpec);
  }
  return parse_node_spec(spec);
}

std::unique_ptr<backend::Backend> make_sim_backend() { return std::make_unique<SimBackend>(); }

}  // namespace sgpu::sim
