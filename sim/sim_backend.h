// The simulated backend: CPU processes pretending to be the GPUs of a node spec
// (sim/node_spec.h). Same inventory type, environment, errors and teardown as "cuda";
// device() is "cpu", process groups are Gloo on CPU tensors (sim/process_group.cc). The
// node comes from Options::sim_node, else SGPU_SIM, else 8xH100. A fault plan
// (sim/faults.h) makes chosen ranks fail at chosen points.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace sgpu::sim {

class SimBackend final : public backend::Backend {
 public:
  std::string_view name() const override { return "sim"; }
  backend::Inventory inventory(const Options& options) const override;
  std::string device(int device_index) const override { return "cpu"; }
  // Applies this rank's start faults and arms its timed ones.
  void bind(int device_index) const override;
  // Gloo on CPU tensors, wrapped to act on collective faults (sim/process_group.cc).
  const backend::ProcessGroupFactory& process_groups() const override;
  // The fault plan (Options::sim_faults, else SGPU_SIM_FAULTS), checked.
  std::vector<std::string> rank_environment(const Options& options) const override;
  // A program's rank: its start and timed faults, acting on the supervisor (and so on the
  // rank); collective and slow faults act only in sgpu's process group.
  void bind_program() const override { bind(0); }
  std::vector<std::string> ending_faults(const Options& options) const override;
};

std::unique_ptr<backend::Backend> make_sim_backend();

}  // namespace sgpu::sim
