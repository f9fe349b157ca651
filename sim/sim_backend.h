// The simulated backend: CPU processes pretending to be the GPUs of a node spec
// (sim/node_spec.h). Same inventory type, environment, errors and teardown as "cuda";
// device() is "cpu" for a C++ rank, process groups run on CPU tensors through shared
// memory (sim/shm) or Gloo (sim/process_group.cc); a Python rank's cuda devices are the
// node's GPUs, served by the CPU (NOTE [CUDA on sim], sim/cuda/sim_cuda.h). The
// node comes from Options::sim_node, else SGPU_SIM, else 8xH100. A fault plan
// (sim/faults.h) makes chosen ranks fail at chosen points.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "contract/rank_env.h"

namespace sgpu::sim {

class SimBackend final : public backend::Backend {
 public:
  std::string_view name() const override { return contract::kSimBackend; }
  backend::Inventory inventory(const Options& options) const override;
  // "cuda:N" where this process serves the node's GPUs as torch's cuda devices (a Python
  // rank, NOTE [CUDA on sim]); "cpu" elsewhere (a C++ rank computes on the CPU).
  std::string device(int device_index) const override;
  // Applies this rank's start faults and arms its timed ones, then makes the rank's CPU
  // allocator the simulated device's (sim/memory/device_allocator.h) unless
  // SGPU_SIM_MEMORY=off.
  void bind(int device_index) const override;
  // The transport's groups, wrapped to act on collective faults (sim/process_group.cc).
  const backend::ProcessGroupFactory& process_groups() const override;
  // The node spec (SGPU_SIM), the transport, and the fault plan (Options::sim_faults, else
  // SGPU_SIM_FAULTS), checked.
  std::vector<std::string> rank_environment(const Options& options) const override;
  // A program's rank: its start and timed faults, acting on the supervisor (and so on the
  // rank); collective and slow faults act only in sgpu's process group. No device memory:
  // the program is another binary.
  void bind_program() const override;
  std::vector<std::string> ending_faults(const Options& options) const override;
  // The simulated device's figures; empty when it counts nothing.
  MemoryStats memory_stats(int device_index) const override;
  void reset_peak_memory_stats(int device_index) const override;
  // Serves the node's GPUs as torch's cuda devices from the CPU (sim/cuda/sim_cuda.h)
  // unless SGPU_SIM_CUDA=off, counting memory on each in device scopes.
  bool serve_cuda(int device_index) const override;
  bool serves_cuda(const Options& options) const override;
  const backend::ServedCuda* served_cuda() const override;
  // Options::sim_compute (SGPU_SIM_COMPUTE stands in for it) is "shapes".
  bool computes_shapes(const Options& options) const override;
};

// The node a call simulates: Options::sim_node (SGPU_SIM stands in for it: NOTE [The
// option table]), else kDefaultNodeSpec.
std::string node_spec_of(const Options& options);

// Whether a simulated device counts memory: SGPU_SIM_MEMORY "on" (or unset) or "off";
// ConfigError for anything else.
inline constexpr const char* kMemoryVar = "SGPU_SIM_MEMORY";
bool counts_memory();

std::unique_ptr<backend::Backend> make_sim_backend();

// Whether a call's ranks compute shapes only: Options::sim_compute (SGPU_SIM_COMPUTE stands
// in for it), "values" (or empty) or "shapes"; ConfigError naming the setting for anything
// else.
bool computes_shapes(const Options& options);
// In a rank: what the launcher chose (SGPU_SIM_COMPUTE).
bool rank_computes_shapes();

// How a simulated rank's collectives travel: shared memory (the default) or Gloo.
enum class Transport { kShm, kGloo };
inline constexpr const char* kTransportVar = "SGPU_SIM_TRANSPORT";
// Options::sim_transport (SGPU_SIM_TRANSPORT stands in for it), else shm (gloo over several
// nodes); ConfigError for another name.
Transport chosen_transport(const Options& options);
const char* transport_name(Transport transport);
// In a rank: what the launcher chose (SGPU_SIM_TRANSPORT).
Transport rank_transport();

}  // namespace sgpu::sim
