#include "sim/memory/device_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/alignment.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <cstdio>
#include <mutex>
#include <stdexcept>

#include "contract/host_memory.h"

namespace sgpu::sim::memory {
namespace {

// Above the default CPU allocator's priority (0), so ours is the one libtorch hands out.
constexpr std::uint8_t kPriority = 100;

class DeviceAllocator final : public c10::Allocator {
 public:
  DeviceAllocator(int device, std::uint64_t capacity) : device_(device), model_(capacity) {}

  c10::DataPtr allocate(std::size_t n) override {
    if (n == 0 || forked_ || contract::host_memory_depth() > 0) {
      return c10::GetDefaultCPUAllocator()->allocate(n);
    }
    OutOfMemory failure;
    CachingModel::Block* block = nullptr;
    {
      std::lock_guard lock(mutex_);
      block = model_.malloc(n, &failure);
    }
    if (block == nullptr)
      C10_THROW_ERROR(OutOfMemoryError, out_of_memory_message(device_, failure));
    void* data = nullptr;
    try {
      data = c10::alloc_cpu(n);
    } catch (...) {
      std::lock_guard lock(mutex_);
      model_.free(block);
      throw;
    }
    CachingModel::set_holder_data(block, data);  // only this tensor's storage reaches it
    return {data, block, &release, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  DeviceStats stats() {
    std::lock_guard lock(mutex_);
    return model_.stats();
  }

  void reset_peaks() {
    std::lock_guard lock(mutex_);
    model_.reset_peak_stats();
  }

  // pthread_atfork: the child gets the mutex unlocked and counts nothing from then on.
  void before_fork() { mutex_.lock(); }
  void after_fork_in_parent() { mutex_.unlock(); }
  void after_fork_in_child() {
    mutex_.unlock();
    forked_ = true;
  }

 private:
  static void release(void* context);

  const int device_;
  std::mutex mutex_;
  CachingModel model_;
  bool forked_ = false;
};

DeviceAllocator* g_allocator = nullptr;  // lives as long as the process

void DeviceAllocator::release(void* context) {
  auto* block = static_cast<CachingModel::Block*>(context);
  void* data = CachingModel::holder_data(block);
  {
    std::lock_guard lock(g_allocator->mutex_);
    g_allocator->model_.free(block);
  }
  c10::free_cpu(data);
}

}  // namespace

void install_device_allocator(int device_index, std::uint64_t capacity) {
  if (g_allocator != nullptr) throw std::logic_error("the simulated device allocator is installed");
  g_allocator = new DeviceAllocator(device_index, capacity);
  ::pthread_atfork([] { g_allocator->before_fork(); }, [] { g_allocator->after_fork_in_parent(); },
                   [] { g_allocator->after_fork_in_child(); });
  c10::SetCPUAllocator(g_allocator, kPriority);
}

std::optional<DeviceStats> device_stats() {
  if (g_allocator == nullptr) return std::nullopt;
  return g_allocator->stats();
}

void reset_peak_stats() {
  if (g_allocator != nullptr) g_allocator->reset_peaks();
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

std::string out_of_memory_message(int device, const OutOfMemory& failure) {
  const auto reserved = static_cast<std::uint64_t>(failure.reserved);
  const auto allocated = static_cast<std::uint64_t>(failure.allocated);
  return "CUDA out of memory. Tried to allocate " + format_size(failure.tried) + ". GPU " +
         std::to_string(device) + " has a total capacity of " + format_size(failure.capacity) +
         " of which " + format_size(failure.free) +
         " is free. Including non-PyTorch memory, this process has " + format_size(reserved) +
         " memory in use. Of the allocated memory " + format_size(allocated) +
         " is allocated by PyTorch, and " + format_size(reserved - allocated) +
         " is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
         "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
         "See documentation for Memory Management  "
         "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
}

}  // namespace sgpu::sim::memory
