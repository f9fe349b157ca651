// torch's CUDA hooks on sim (NOTE [CUDA on sim]): at::detail::getCUDAHooks() answers for
// the simulated node. torch makes its hooks object once, when it first asks (by the time
// `import torch` returns), and keeps it for the process's life; so the sim hooks take that
// object's place in its storage. Both types are the interface's vtable and nothing else
// (static_assert below), which is what makes this a swap of behaviour and not of layout.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <mutex>
#include <new>
#include <unordered_set>
#include <vector>

#include "sim/cuda/generator.h"
#include "sim/cuda/parts.h"
#include "sim/memory/device_allocator.h"

namespace sgpu::sim::cuda {
namespace {

// What CUDA's default generators start from (c10::default_rng_seed_val).
constexpr std::uint64_t kDefaultSeed = 67280421310721ULL;

std::vector<at::Generator>& generators() {
  static auto* all = new std::vector<at::Generator>;  // outlives any exit path
  return *all;
}

const c10::impl::DeviceGuardImplInterface& guard() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

c10::DeviceIndex resolve(c10::DeviceIndex index) { return index < 0 ? current_device() : index; }

// Pinned host memory on sim: the CPU's memory, each allocation remembered until it is
// freed, so that is_pinned() says of it what a GPU node says (the DDP reducer asserts it of
// the buffer it pinned) and of other host memory that it is not pinned.
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t bytes) override {
    auto* held = new c10::DataPtr(c10::GetCPUAllocator()->allocate(bytes));
    void* data = held->get();
    if (data != nullptr) {
      std::lock_guard lock(mutex());
      pinned().insert(data);
    }
    return {data, held, &release, c10::Device(c10::DeviceType::CPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  static bool holds(const void* data) {
    std::lock_guard lock(mutex());
    return pinned().count(data) != 0;
  }

 private:
  static void release(void* context) {
    auto* held = static_cast<c10::DataPtr*>(context);
    {
      std::lock_guard lock(mutex());
      pinned().erase(held->get());
    }
    delete held;
  }
  static std::mutex& mutex() {
    static auto* lock = new std::mutex;  // outlives any exit path, as the memory it guards
    return *lock;
  }
  static std::unordered_set<const void*>& pinned() {
    static auto* all = new std::unordered_set<const void*>;
    return *all;
  }
};

PinnedAllocator& pinned_allocator() {
  static auto* allocator = new PinnedAllocator;
  return *allocator;
}

struct SimHooks final : at::CUDAHooksInterface {
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasCUDART() const override { return true; }
  long versionCUDART() const override { return 13000; }
  int getNumGPUs() const override { return guard().deviceCount(); }
  c10::DeviceIndex deviceCount() const override { return guard().deviceCount(); }
  c10::DeviceIndex current_device() const override { return cuda::current_device(); }
  c10::DeviceIndex getCurrentDevice() const override { return cuda::current_device(); }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    guard().setDevice({c10::DeviceType::CUDA, device});
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return guard().exchangeDevice({c10::DeviceType::CUDA, device}).index();
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  // Pinning changes nothing of host memory on sim, but is remembered (PinnedAllocator).
  bool isPinnedPtr(const void* data) const override { return PinnedAllocator::holds(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  c10::Allocator* getCUDADeviceAllocator() const override {
    return memory::cuda_device_allocator(cuda::current_device());
  }
  c10::Device getDeviceFromPtr(void*) const override {
    return {c10::DeviceType::CUDA, cuda::current_device()};
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return generators().at(static_cast<std::size_t>(resolve(index)));
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return at::make_generator<at::CPUGeneratorImpl>(kDefaultSeed);
  }
  void deviceSynchronize(c10::DeviceIndex) const override {}
  // No cuDNN: convolutions take the native kernels, whose CPU ones run.
  bool hasCuDNN() const override { return false; }
  bool compiledWithCuDNN() const override { return false; }
  std::string showConfig() const override {
    return "  - CUDA on sim: the simulated node's GPUs, served by the CPU (sgpu)\n";
  }
};

static_assert(sizeof(SimHooks) == sizeof(at::CUDAHooksInterface),
              "the sim hooks must have the interface's layout: they replace torch's in place");

}  // namespace

void install_hooks(int count) {
  for (int i = 0; i < count; ++i) {
    generators().push_back(at::make_generator<DeviceGenerator>(kDefaultSeed));
  }
  auto* live = const_cast<at::CUDAHooksInterface*>(&at::detail::getCUDAHooks());
  // The object torch keeps is at::cuda::detail::CUDAHooks, which adds no member to the
  // interface: the sim hooks are built in its place and torch's pointer now reaches them.
  new (live) SimHooks();
}

}  // namespace sgpu::sim::cuda
