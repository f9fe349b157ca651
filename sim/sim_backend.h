// The simulated backend: CPU processes pretending to be the GPUs of a node spec
// (sim/node_spec.h). Same inventory type, environment, errors and teardown as "cuda";
// device() is "cpu", process groups run on CPU tensors through shared memory (sim/shm) or
// Gloo (sim/process_group.cc). The
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
  // The transport's groups, wrapped to act on collective faults (sim/process_group.cc).
  const backend::ProcessGroupFactory& process_groups() const override;
  // The transport, and the fault plan (Options::sim_faults, else SGPU_SIM_FAULTS), checked.
  std::vector<std::string> rank_environment(const Options& options) const override;
  // A program's rank: its start and timed faults, acting on the supervisor (and so on the
  // rank); collective and slow faults act only in sgpu's process group.
  void bind_program() const override { bind(0); }
  std::vector<std::string> ending_faults(const Options& options) const override;
};

std::unique_ptr<backend::Backend> make_sim_backend();

// How a simulated rank's collectives travel: shared memory (the default) or Gloo.
enum class Transport { kShm, kGloo };
inline constexpr const char* kTransportVar = "SGPU_SIM_TRANSPORT";
// Options::sim_transport, else SGPU_SIM_TRANSPORT, else shm; ConfigError for another name.
Transport chosen_transport(const Options& options);
const char* transport_name(Transport transport);
// In a rank: what the launcher chose (SGPU_SIM_TRANSPORT).
Transport rank_transport();

}  // namespace sgpu::sim
