#include "sim/memory/device_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "contract/host_memory.h"
#include "contract/node_memory.h"

namespace sgpu::sim::memory {
namespace {

// Above the default CPU allocator's priority (0), so ours is the one libtorch hands out.
constexpr std::uint8_t kPriority = 100;

thread_local int t_device_scope = -1;

// One simulated GPU's memory: the caching allocator's model of it, under a lock.
struct Device {
  explicit Device(std::uint64_t capacity) : model(capacity), node_capacity(capacity) {}
  std::mutex mutex;
  CachingModel model;
  std::uint64_t node_capacity;             // before any memory fraction
  std::unique_ptr<SharedCapacity> shared;  // the node's ledger's share of this GPU, if any
};

// A GPU's capacity in the node's ledger (NOTE [A node's shared device memory]).
class LedgerShare final : public SharedCapacity {
 public:
  LedgerShare(contract::NodeMemory* ledger, int gpu, std::uint64_t capacity)
      : ledger_(ledger), gpu_(gpu), capacity_(capacity) {}
  bool take(std::uint64_t bytes) override { return ledger_->take(gpu_, bytes, capacity_); }
  void give(std::uint64_t bytes) override { ledger_->give(gpu_, bytes); }
  std::uint64_t free() override {
    const std::uint64_t held = ledger_->held(gpu_);
    return held < capacity_ ? capacity_ - held : 0;
  }
  std::vector<std::pair<long, std::uint64_t>> others() override { return ledger_->others(gpu_); }

 private:
  contract::NodeMemory* ledger_;
  int gpu_;
  std::uint64_t capacity_;
};

// What an allocation carries to its release, in a header just before its data: the
// DataPtr's context is its data, as libtorch's raw_allocate() requires of an allocator
// (oneDNN's bfloat16 matmuls allocate their scratch so), and raw_deleter() releases any
// allocation from its pointer alone. Allocations outside any device's count carry a null
// device.
struct Header {
  Device* device;
  CachingModel::Block* block;
};
constexpr std::size_t kHeaderBytes = c10::gAlignment;  // the data stays as aligned as alloc_cpu's
static_assert(sizeof(Header) <= kHeaderBytes);

void release_with_header(void* data) {
  if (data == nullptr) return;
  void* base = static_cast<char*>(data) - kHeaderBytes;
  const Header header = *static_cast<Header*>(base);
  if (header.device != nullptr) {
    std::lock_guard lock(header.device->mutex);
    header.device->model.free(header.block);
  }
  c10::free_cpu(base);
}

// `n` bytes of host memory, counted as `block` of `device` (none: nullptr) until released.
c10::DataPtr with_header(Device* device, CachingModel::Block* block, std::size_t n) {
  if (n == 0) return {nullptr, nullptr, &release_with_header, c10::Device(c10::DeviceType::CPU)};
  void* base = c10::alloc_cpu(n + kHeaderBytes);
  *static_cast<Header*>(base) = Header{device, block};
  void* data = static_cast<char*>(base) + kHeaderBytes;
  return {data, data, &release_with_header, c10::Device(c10::DeviceType::CPU)};
}

// A block of a device's model with no memory behind it (count_without_data).
struct Counted {
  Device* device;
  CachingModel::Block* block;
};

class DeviceAllocator final : public c10::Allocator {
 public:
  DeviceAllocator(int bound, std::uint64_t capacity) : bound_(bound) {
    devices_.resize(static_cast<std::size_t>(bound) + 1);
    devices_[bound] = std::make_unique<Device>(capacity);
  }

  // Counts only inside DeviceScopes from now on, with a model for every device.
  void count_in_scopes(const std::vector<std::uint64_t>& capacities) {
    std::lock_guard lock(devices_mutex_);
    if (devices_.size() < capacities.size()) devices_.resize(capacities.size());
    for (std::size_t i = 0; i < capacities.size(); ++i) {
      if (!devices_[i]) devices_[i] = std::make_unique<Device>(capacities[i]);
    }
    scoped_ = true;
  }
  bool scoped() const { return scoped_; }

  c10::DataPtr allocate(std::size_t n) override {
    const int device = scoped_ ? t_device_scope : bound_;
    if (n == 0 || forked_ || device < 0 || (!scoped_ && contract::host_memory_depth() > 0)) {
      return with_header(nullptr, nullptr, n);
    }
    return allocate_on(device, n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_with_header; }

  c10::DataPtr allocate_on(int index, std::size_t n) {
    Device* device = find(index);
    if (device == nullptr || n == 0) return with_header(nullptr, nullptr, n);
    CachingModel::Block* block = counted(device, index, n);
    try {
      return with_header(device, block, n);
    } catch (...) {
      std::lock_guard lock(device->mutex);
      device->model.free(block);
      throw;
    }
  }

  // A block of the device's model with no memory behind it (count_without_data).
  c10::DataPtr count_on(int index, std::size_t n) {
    Device* device = find(index);
    if (device == nullptr || n == 0) return {};
    auto* counted_block = new Counted{device, counted(device, index, n)};
    return {nullptr, counted_block, &release_count, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // The device's model under its lock; nullptr when it has none. -1 is the rank's own.
  Device* find(int index) {
    if (index < 0) index = bound_;
    std::lock_guard lock(devices_mutex_);
    return static_cast<std::size_t>(index) < devices_.size() ? devices_[index].get() : nullptr;
  }

  // pthread_atfork: the child gets the mutexes unlocked and counts nothing from then on.
  void before_fork() {
    devices_mutex_.lock();
    for (auto& device : devices_)
      if (device) device->mutex.lock();
  }
  void after_fork_in_parent() {
    for (auto& device : devices_)
      if (device) device->mutex.unlock();
    devices_mutex_.unlock();
  }
  void after_fork_in_child() {
    after_fork_in_parent();
    forked_ = true;
  }
  void count_again() { forked_ = false; }

 private:
  // `n` bytes of the device's model, or CUDA's out-of-memory error.
  static CachingModel::Block* counted(Device* device, int index, std::size_t n) {
    OutOfMemory failure;
    CachingModel::Block* block = nullptr;
    {
      std::lock_guard lock(device->mutex);
      block = device->model.malloc(n, &failure);
    }
    if (block == nullptr) C10_THROW_ERROR(OutOfMemoryError, out_of_memory_message(index, failure));
    return block;
  }

  static void release_count(void* context) {
    auto* counted_block = static_cast<Counted*>(context);
    {
      std::lock_guard lock(counted_block->device->mutex);
      counted_block->device->model.free(counted_block->block);
    }
    delete counted_block;
  }

  const int bound_;
  std::mutex devices_mutex_;
  std::vector<std::unique_ptr<Device>> devices_;  // by index; those never seen are null
  std::atomic<bool> scoped_{false};
  bool forked_ = false;
};

DeviceAllocator* g_allocator = nullptr;  // lives as long as the process

void install(int device_index, std::uint64_t capacity) {
  g_allocator = new DeviceAllocator(device_index, capacity);
  ::pthread_atfork([] { g_allocator->before_fork(); }, [] { g_allocator->after_fork_in_parent(); },
                   [] { g_allocator->after_fork_in_child(); });
  c10::SetCPUAllocator(g_allocator, kPriority);
}

// Runs `f` on the device's model under its lock; nothing when there is none.
template <typename F>
void with_model(int device, F f) {
  if (g_allocator == nullptr) return;
  if (Device* d = g_allocator->find(device)) {
    std::lock_guard lock(d->mutex);
    f(*d);
  }
}

// Allocations of one simulated GPU, wherever they happen: a DataPtr on cuda:N.
class CudaDeviceAllocator final : public c10::Allocator {
 public:
  explicit CudaDeviceAllocator(int device) : device_(device) {}
  int device() const { return device_; }

  c10::DataPtr allocate(std::size_t n) override {
    return (g_allocator != nullptr && g_allocator->scoped() && n > 0)
               ? g_allocator->allocate_on(device_, n)
               : with_header(nullptr, nullptr, n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release_with_header; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  const int device_;
};

// One per device index a c10::Device can name, made on first use, never freed: storages
// keep pointers to them.
std::array<std::atomic<CudaDeviceAllocator*>, 128> g_cuda_allocators{};

}  // namespace

void install_device_allocator(int device_index, std::uint64_t capacity) {
  if (g_allocator != nullptr) throw std::logic_error("the simulated device allocator is installed");
  install(device_index, capacity);
}

void count_in_device_scopes(int device_index, const std::vector<std::uint64_t>& capacities) {
  if (g_allocator == nullptr) install(device_index, capacities.at(device_index));
  g_allocator->count_in_scopes(capacities);
}

void share_node_memory(contract::NodeMemory* ledger, const std::vector<int>& node_indices) {
  if (ledger == nullptr) return;
  for (std::size_t i = 0; i < node_indices.size(); ++i) {
    with_model(static_cast<int>(i), [&](Device& d) {
      if (d.shared) return;
      d.shared = std::make_unique<LedgerShare>(ledger, node_indices[i], d.node_capacity);
      d.model.share(d.shared.get());
    });
  }
}

std::optional<std::uint64_t> free_memory(int device) {
  std::optional<std::uint64_t> bytes;
  with_model(device, [&](Device& d) { bytes = d.model.free_bytes(); });
  return bytes;
}

void count_in_forked_child() {
  if (g_allocator != nullptr) g_allocator->count_again();
}

bool counts_in_device_scopes() { return g_allocator != nullptr && g_allocator->scoped(); }

DeviceScope::DeviceScope(int device) : previous_(t_device_scope) { t_device_scope = device; }
DeviceScope::~DeviceScope() { t_device_scope = previous_; }

c10::Allocator* cuda_device_allocator(int device) {
  auto& slot = g_cuda_allocators.at(static_cast<std::size_t>(device));
  CudaDeviceAllocator* allocator = slot.load();
  if (allocator == nullptr) {
    auto* made = new CudaDeviceAllocator(device);
    if (slot.compare_exchange_strong(allocator, made)) {
      allocator = made;
    } else {
      delete made;
    }
  }
  return allocator;
}

int cuda_device_of(const c10::Allocator* allocator) {
  for (const auto& slot : g_cuda_allocators) {
    const CudaDeviceAllocator* candidate = slot.load();
    if (candidate != nullptr && candidate == allocator) return candidate->device();
  }
  return -1;
}

c10::DataPtr count_without_data(int device, std::size_t bytes) {
  return g_allocator != nullptr ? g_allocator->count_on(device, bytes) : c10::DataPtr();
}

std::optional<DeviceStats> device_stats(int device) {
  std::optional<DeviceStats> stats;
  with_model(device, [&](Device& d) { stats = d.model.stats(); });
  return stats;
}

void reset_peak_stats(int device) {
  with_model(device, [](Device& d) { d.model.reset_peak_stats(); });
}

void reset_accumulated_stats(int device) {
  with_model(device, [](Device& d) { d.model.reset_accumulated_stats(); });
}

void empty_cache(int device) {
  with_model(device, [](Device& d) { d.model.empty_cache(); });
}

void set_memory_fraction(int device, double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("a memory fraction is between 0 and 1, got " +
                                std::to_string(fraction));
  }
  with_model(device, [&](Device& d) {
    d.model.set_capacity(
        static_cast<std::uint64_t>(static_cast<double>(d.node_capacity) * fraction));
  });
}

std::optional<std::uint64_t> capacity(int device) {
  std::optional<std::uint64_t> bytes;
  with_model(device, [&](Device& d) { bytes = d.model.capacity(); });
  return bytes;
}

std::string format_size(std::uint64_t bytes) {
  char text[64];
  const auto value = static_cast<double>(bytes);
  if (bytes <= 1024) {
    std::snprintf(text, sizeof text, "%llu bytes", static_cast<unsigned long long>(bytes));
  } else if (bytes <= (std::uint64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f KiB", value / 1024.0);
  } else if (bytes <= (std::uint64_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f MiB", value / 1048576.0);
  } else {
    std::snprintf(text, sizeof text, "%.2f GiB", value / 1073741824.0);
  }
  return text;
}

namespace {

// What CUDA's message says of the other processes on the GPU, as torch words it from NVML.
std::string others_text(const OutOfMemory& failure) {
  std::string text;
  for (const auto& [pid, bytes] : failure.others) {
    text += "Process " + std::to_string(pid) + " has " + format_size(bytes) + " memory in use. ";
  }
  return text;
}

}  // namespace

std::string out_of_memory_message(int device, const OutOfMemory& failure) {
  const auto reserved = static_cast<std::uint64_t>(failure.reserved);
  const auto allocated = static_cast<std::uint64_t>(failure.allocated);
  return "CUDA out of memory. Tried to allocate " + format_size(failure.tried) + ". GPU " +
         std::to_string(device) + " has a total capacity of " + format_size(failure.capacity) +
         " of which " + format_size(failure.free) + " is free. " + others_text(failure) +
         "Including non-PyTorch memory, this process has " + format_size(reserved) +
         " memory in use. Of the allocated memory " + format_size(allocated) +
         " is allocated by PyTorch, and " + format_size(reserved - allocated) +
         " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
         "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
         "See documentation for Memory Management  "
         "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
}

}  // namespace sgpu::sim::memory
