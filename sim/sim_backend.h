// The simulated backend: CPU processes pretending to be the GPUs of a node spec
// (sim/node_spec.h). Same inventory type, environment, errors and teardown as "cuda";
// device() is "cpu". The node comes from Options::sim_node, else SGPU_SIM, else 8xH100.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace sgpu::sim {

class SimBackend final : public backend::Backend {
 public:
  std::string_view name() const override { return "sim"; }
  backend::Inventory inventory(const Options& options) const override;
  std::string device(int device_index) const override { return "cpu"; }
};

std::unique_ptr<backend::Backend> make_sim_backend();

}  // namespace sgpu::sim
