#include <c10/core/Allocator.h>
#include <c10/util/Registry.h>

#include <atomic>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <vector>

#include "contract/option_table.h"
#include "sgpu/errors.h"
#include "sim/cuda/parts.h"
#include "sim/cuda/sim_cuda.h"
#include "sim/memory/device_allocator.h"
#include "sim/sim_backend.h"

namespace sgpu::sim::cuda {
namespace {

std::atomic<int> g_served{0};  // the device count once served

// The DDP reducer times its first iterations with CUDA events on a cuda module; on sim the
// host's clock is the device's (as the reducer's CPU timer keeps it).
class SimTimer final : public c10d::Timer {
 public:
  explicit SimTimer(c10::Device) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const auto from = getTimestamp(start);
    const auto to = getTimestamp(end);
    if (!from || !to) return std::nullopt;
    return *to - *from;
  }
};

// torch's allocator for the cuda device type (c10::GetAllocator(kCUDA): a storage made on
// cuda, as torch.load's do): the current device's.
class CurrentDeviceAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    return memory::cuda_device_allocator(current_device())->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return memory::cuda_device_allocator(0)->raw_deleter();  // every device's is the same
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

void install_allocator() {
  static CurrentDeviceAllocator allocator;
  c10::SetAllocator(c10::DeviceType::CUDA, &allocator, /*priority=*/255);
}

void install_reducer_timer() {
  using Registerer = c10::Registerer<c10::DeviceType, std::unique_ptr<c10d::Timer>, c10::Device>;
  static Registerer timer(c10::DeviceType::CUDA, c10::REGISTRY_PREFERRED, c10d::TimerRegistry(),
                          Registerer::DefaultCreator<SimTimer>);
}

}  // namespace

bool enabled() { return contract::environment_flag("sim_cuda", true, contract::kRankSide); }

void serve(const backend::Inventory& node, int device_index) {
  if (g_served.load() != 0) {
    cover_operators();
    return;
  }
  const int count = static_cast<int>(node.gpus.size());
  install_guard(count, device_index);
  install_hooks(count);
  if (counts_memory()) {
    std::vector<std::uint64_t> capacities;
    for (const backend::Gpu& gpu : node.gpus) capacities.push_back(gpu.memory_bytes);
    memory::count_in_device_scopes(device_index, capacities);
  }
  install_allocator();
  install_reducer_timer();
  cover_operators();
  g_served = count;
}

void cover_operators_ahead() { cover_operators(); }

bool served() { return g_served.load() != 0; }

void empty_cache(int device) { memory::empty_cache(device); }

void reset_accumulated_memory_stats(int device) { memory::reset_accumulated_stats(device); }

void set_memory_fraction(int device, double fraction) {
  memory::set_memory_fraction(device, fraction);
}

int device_count() { return g_served.load(); }

}  // namespace sgpu::sim::cuda
