// The simulated devices' allocator (sim/memory/device_allocator.h), installed as libtorch's
// CPU allocator in this process as in a simulated rank: what it hands out is counted while
// held and freed with its last owner, through a DataPtr or through raw_allocate(), which
// libtorch's own kernels use (oneDNN's bfloat16 matmuls among them).
#include "sim/memory/device_allocator.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace sgpu::sim::memory {
namespace {

constexpr std::uint64_t kCapacity = std::uint64_t{1} << 30;

std::int64_t allocated() {
  static const bool installed = (install_device_allocator(0, kCapacity), true);
  (void)installed;
  return device_stats(0)
      ->allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

TEST(DeviceAllocator, ADataPtrIsCountedWhileHeld) {
  const std::int64_t before = allocated();
  {
    c10::DataPtr held = c10::GetCPUAllocator()->allocate(3 << 20);
    EXPECT_EQ(allocated(), before + (3 << 20));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(held.get()) % c10::gAlignment, 0u);
    EXPECT_EQ(held.get(), held.get_context());
  }
  EXPECT_EQ(allocated(), before);
}

TEST(DeviceAllocator, RawAllocationsAreCountedAndFreedByTheRawDeleter) {
  const std::int64_t before = allocated();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* raw = allocator->raw_allocate(1 << 20);
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(allocated(), before + (1 << 20));
  allocator->raw_deallocate(raw);
  EXPECT_EQ(allocated(), before);
  allocator->raw_deallocate(allocator->raw_allocate(0));
}

TEST(DeviceAllocator, ABfloat16MatmulRunsOnIt) {
  const std::int64_t before = allocated();
  {
    const at::Tensor a = at::ones({64, 128}, at::kBFloat16);
    const at::Tensor b = at::ones({128, 32}, at::kBFloat16);
    const at::Tensor c = at::linear(a, b.t().contiguous());
    EXPECT_EQ(c.sizes(), (at::IntArrayRef{64, 32}));
    EXPECT_EQ(c[0][0].item<float>(), 128);
  }
  EXPECT_EQ(allocated(), before);
}

}  // namespace
}  // namespace sgpu::sim::memory
