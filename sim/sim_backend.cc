#include "sim/sim_backend.h"

#include <cstdlib>
#include <string>

#include "backend/memory_stats.h"
#include "backend/served_cuda.h"
#include "contract/node_memory.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "sgpu/errors.h"
#include "sim/cuda/sim_cuda.h"
#include "sim/memory/device_allocator.h"
#include "sim/node_spec.h"

namespace sgpu::sim {

std::string node_spec_of(const Options& options) {
  return options.sim.node.empty() ? std::string(kDefaultNodeSpec) : options.sim.node;
}

namespace {

// The node of this process's environment: in a rank, the one its launcher resolved (SGPU_SIM).
std::string rank_node_spec() {
  const std::string spec = contract::environment_text("sim_node", contract::kRankSide);
  return spec.empty() ? std::string(kDefaultNodeSpec) : spec;
}

// The node's ledger of device memory for this process (NOTE [A node's shared device memory]):
// a rank opens the one its environment names; a process on the node that sgpu did not start
// makes one when none is named.
void share_node_memory() {
  const bool on_node = contract::read_rank_environment().backend.empty();
  contract::NodeMemory* ledger = contract::NodeMemory::of_process(on_node);
  if (ledger == nullptr) return;
  const std::string spec = rank_node_spec();
  const int count = static_cast<int>(parse_node_spec(spec).gpus.size());
  memory::share_node_memory(ledger, visible_indices(count, std::getenv("CUDA_VISIBLE_DEVICES")));
}

}  // namespace

backend::Inventory SimBackend::inventory(const Options& options) const {
  return visible_node(node_spec_of(options));
}

bool counts_memory() { return contract::setting_flag(kMemoryVar, true); }

void SimBackend::bind(int device_index) const {
  bind_program();
  if (!counts_memory()) return;
  const backend::Inventory node = visible_node(rank_node_spec());
  if (device_index < 0 || device_index >= static_cast<int>(node.gpus.size())) {
    throw ConfigError("simulated device " + std::to_string(device_index) + " is not on the node " +
                      node.sim_spec);
  }
  memory::install_device_allocator(device_index, node.gpus[device_index].memory_bytes);
  share_node_memory();
}

MemoryStats SimBackend::memory_stats(int device_index) const {
  const auto stats = memory::device_stats(device_index);
  return stats ? backend::memory_stats_of(*stats) : MemoryStats{};
}

void SimBackend::reset_peak_memory_stats(int device_index) const {
  memory::reset_peak_stats(device_index);
}

bool SimBackend::serve_cuda(int device_index) const {
  if (!cuda::enabled()) return false;
  const backend::Inventory node = visible_node(rank_node_spec());
  if (node.gpus.empty()) return false;  // CUDA_VISIBLE_DEVICES hides them all: no GPU, as CUDA
  cuda::serve(node, device_index);
  share_node_memory();
  return true;
}

bool SimBackend::serves_cuda(const Options& options) const { return options.sim.cuda; }

bool SimBackend::computes_shapes(const Options& options) const {
  return sim::computes_shapes(options);
}

namespace {

// The node's GPUs as torch's cuda devices (NOTE [CUDA on sim]), for the native module.
class SimServedCuda final : public backend::ServedCuda {
 public:
  void set_refusal(Refusal refusal) const override { cuda::set_refusal(refusal); }
  void check_node(const std::string& spec) const override { (void)parse_node_spec(spec); }
  std::string node() const override { return rank_node_spec(); }
  void cover_operators_ahead() const override { cuda::cover_operators_ahead(); }
  void count_in_forked_child() const override { memory::count_in_forked_child(); }
  std::optional<std::uint64_t> free_memory(int device) const override {
    return memory::free_memory(device);
  }
  void empty_cache(int device) const override { cuda::empty_cache(device); }
  void reset_accumulated_memory_stats(int device) const override {
    cuda::reset_accumulated_memory_stats(device);
  }
  void set_memory_fraction(int device, double fraction) const override {
    cuda::set_memory_fraction(device, fraction);
  }
  c10::DataPtr count_without_data(int device, std::size_t bytes) const override {
    return memory::count_without_data(device, bytes);
  }
  int device_of(const c10::Storage& storage) const override { return cuda::device_of(storage); }
};

}  // namespace

const backend::ServedCuda* SimBackend::served_cuda() const {
  static const SimServedCuda served;
  return &served;
}

std::unique_ptr<backend::Backend> make_sim_backend() { return std::make_unique<SimBackend>(); }

std::string SimBackend::device(int device_index) const {
  return cuda::served() ? "cuda:" + std::to_string(device_index) : "cpu";
}

}  // namespace sgpu::sim
