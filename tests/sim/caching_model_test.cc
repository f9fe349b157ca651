// The simulated device's memory model against the CUDA caching allocator's rules (NOTE
// [Simulated device memory]): rounding, pools and segment sizes, splitting, reuse,
// merging, release on a failed segment, and the statistics torch.cuda.memory_stats() reads.
#include "sim/memory/caching_model.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "sim/memory/device_allocator.h"

namespace sgpu::sim::memory {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kAll = 0, kSmall = 1, kLarge = 2;

std::int64_t current(const c10::CachingAllocator::StatArray& stat, std::size_t type = kAll) {
  return stat[type].current;
}

TEST(CachingModel, RoundsAsTheCachingAllocator) {
  EXPECT_EQ(round_size(1), 512u);
  EXPECT_EQ(round_size(512), 512u);
  EXPECT_EQ(round_size(513), 1024u);
  EXPECT_EQ(round_size(4000), 4096u);
  EXPECT_EQ(segment_size(512), 2 * kMiB);
  EXPECT_EQ(segment_size(kMiB), 2 * kMiB);         // the largest small request
  EXPECT_EQ(segment_size(kMiB + 512), 20 * kMiB);  // 1-10 MiB: a 20 MiB segment
  EXPECT_EQ(segment_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(segment_size(10 * kMiB), 10 * kMiB);  // from 10 MiB: rounded to 2 MiB
  EXPECT_EQ(segment_size(11 * kMiB), 12 * kMiB);
}

// What other processes leave of a shared GPU: `room` bytes, `others` holding the rest.
class FakeShare final : public SharedCapacity {
 public:
  explicit FakeShare(std::uint64_t room) : room_(room) {}
  bool take(std::uint64_t bytes) override {
    if (bytes > room_) return false;
    room_ -= bytes;
    return true;
  }
  void give(std::uint64_t bytes) override { room_ += bytes; }
  std::uint64_t free() override { return room_; }
  std::vector<std::pair<long, std::uint64_t>> others() override { return {{4242, 60 * kMiB}}; }

 private:
  std::uint64_t room_;
};

TEST(CachingModel, ASharedGpuServesOnlyWhatNoOtherProcessHolds) {
  CachingModel model(100 * kMiB);  // this process alone could take 100 MiB
  FakeShare share(40 * kMiB);      // others hold 60 of them
  model.share(&share);
  EXPECT_EQ(model.free_bytes(), 40 * kMiB);
  OutOfMemory failure;
  CachingModel::Block* a = model.malloc(30 * kMiB, &failure);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(share.free(), 10 * kMiB);  // the segment came from the shared capacity
  EXPECT_EQ(model.malloc(20 * kMiB, &failure), nullptr);
  EXPECT_EQ(failure.free, 10 * kMiB);
  EXPECT_EQ(failure.others.size(), 1u);
  EXPECT_EQ(model.stats().num_ooms, 1);
  model.free(a);
  model.empty_cache();  // the released segment goes back to the node
  EXPECT_EQ(share.free(), 40 * kMiB);
  EXPECT_NE(out_of_memory_message(0, failure)
                .find(" is free. Process 4242 has 60.00 MiB memory "
                      "in use. Including non-PyTorch memory"),
            std::string::npos);
}

TEST(CachingModel, SplitsALargeBlockOnlyWhenMoreThanOneMiBRemains) {
  CachingModel model(1024 * kMiB);
  OutOfMemory failure;
  // 9 MiB takes a 20 MiB segment; the 11 MiB left are split off and cached.
  CachingModel::Block* a = model.malloc(9 * kMiB, &failure);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(CachingModel::size_of(a), 9 * kMiB);
  EXPECT_EQ(current(model.stats().reserved_bytes), 20 * kMiB);
  EXPECT_EQ(current(model.stats().inactive_split_bytes), 11 * kMiB);
  EXPECT_EQ(current(model.stats().inactive_split), 1);
  // 10 MiB from the cached 11: 1 MiB would remain, not more, so the block is all 11.
  CachingModel::Block* b = model.malloc(10 * kMiB, &failure);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(CachingModel::size_of(b), 11 * kMiB);
  EXPECT_EQ(model.stats().num_device_alloc, 1);
  EXPECT_EQ(current(model.stats().allocated_bytes), 20 * kMiB);
  EXPECT_EQ(current(model.stats().requested_bytes), 19 * kMiB);
  EXPECT_EQ(current(model.stats().inactive_split), 0);
  // Freed, a is an inactive split block; 1.5 MiB takes its front and leaves 7.5 MiB.
  model.free(a);
  EXPECT_EQ(current(model.stats().inactive_split_bytes), 9 * kMiB);
  CachingModel::Block* c = model.malloc(3 * kMiB / 2, &failure);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(CachingModel::size_of(c), 3 * kMiB / 2);
  EXPECT_EQ(current(model.stats().inactive_split_bytes), 15 * kMiB / 2);
  EXPECT_EQ(current(model.stats().inactive_split), 1);
  // Freeing the rest merges the segment whole again, and empty_cache releases it.
  model.free(b);
  model.free(c);
  EXPECT_EQ(current(model.stats().inactive_split), 0);
  EXPECT_EQ(current(model.stats().inactive_split_bytes), 0);
  EXPECT_EQ(current(model.stats().reserved_bytes), 20 * kMiB);
  model.empty_cache();
  EXPECT_EQ(current(model.stats().reserved_bytes), 0);
  EXPECT_EQ(model.stats().num_device_free, 1);
}

TEST(CachingModel, SmallRequestsShareTwoMiBSegments) {
  CachingModel model(1024 * kMiB);
  OutOfMemory failure;
  std::vector<CachingModel::Block*> blocks;
  for (int i = 0; i < 4096; ++i) blocks.push_back(model.malloc(100, &failure));  // 512 B each
  EXPECT_EQ(current(model.stats().segment, kSmall), 1);
  EXPECT_EQ(current(model.stats().allocated_bytes, kSmall), 2 * kMiB);
  blocks.push_back(model.malloc(100, &failure));
  EXPECT_EQ(current(model.stats().segment, kSmall), 2);
  EXPECT_EQ(current(model.stats().segment, kLarge), 0);
  EXPECT_EQ(current(model.stats().allocation), 4097);
  for (CachingModel::Block* block : blocks) model.free(block);
  EXPECT_EQ(current(model.stats().allocated_bytes), 0);
  EXPECT_EQ(model.stats().allocated_bytes[kAll].peak, std::int64_t{2 * kMiB} + 512);
}

TEST(CachingModel, AFailedSegmentReleasesTheCacheRetriesThenFails) {
  CachingModel model(64 * kMiB);
  OutOfMemory failure;
  CachingModel::Block* a = model.malloc(30 * kMiB, &failure);  // a 30 MiB segment
  CachingModel::Block* b = model.malloc(30 * kMiB, &failure);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  model.free(a);  // cached: 60 MiB reserved, 30 allocated
  // 32 MiB fits neither the cached 30 MiB block nor the 4 MiB left: the cached segment is
  // released, and the retry succeeds.
  CachingModel::Block* c = model.malloc(32 * kMiB, &failure);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(model.stats().num_alloc_retries, 1);
  EXPECT_EQ(model.stats().num_ooms, 0);
  EXPECT_EQ(current(model.stats().reserved_bytes), 62 * kMiB);
  // Nothing cached is left to release: 10 MiB does not fit in 2.
  EXPECT_EQ(model.malloc(10 * kMiB, &failure), nullptr);
  EXPECT_EQ(model.stats().num_ooms, 1);
  EXPECT_EQ(failure.tried, 10 * kMiB);
  EXPECT_EQ(failure.capacity, 64 * kMiB);
  EXPECT_EQ(failure.free, 2 * kMiB);
  EXPECT_EQ(failure.allocated, std::int64_t{62 * kMiB});
  EXPECT_EQ(failure.reserved, std::int64_t{62 * kMiB});
  EXPECT_EQ(current(model.stats().allocation), 2);  // the failure changed nothing else
  EXPECT_EQ(out_of_memory_message(3, failure),
            "CUDA out of memory. Tried to allocate 10.00 MiB. GPU 3 has a total capacity of "
            "64.00 MiB of which 2.00 MiB is free. Including non-PyTorch memory, this process has "
            "62.00 MiB memory in use. Of the allocated memory 62.00 MiB is allocated by PyTorch, "
            "and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated "
            "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
            "avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)");
}

TEST(CachingModel, ResetPeaksStartFromTheCurrentFigures) {
  CachingModel model(1024 * kMiB);
  OutOfMemory failure;
  CachingModel::Block* big = model.malloc(64 * kMiB, &failure);
  CachingModel::Block* small = model.malloc(1000, &failure);
  model.free(big);
  EXPECT_EQ(model.stats().allocated_bytes[kAll].peak, std::int64_t{64 * kMiB} + 1024);
  model.reset_peak_stats();
  EXPECT_EQ(model.stats().allocated_bytes[kAll].peak, 1024);
  EXPECT_EQ(model.stats().reserved_bytes[kAll].peak, std::int64_t{66 * kMiB});  // still cached
  EXPECT_EQ(model.stats().allocation[kAll].peak, 1);
  EXPECT_EQ(model.stats().allocated_bytes[kAll].allocated, std::int64_t{64 * kMiB} + 1024);
  model.free(small);
}

TEST(CachingModel, SizesPrintAsTorchPrintsThem) {
  EXPECT_EQ(format_size(0), "0 bytes");
  EXPECT_EQ(format_size(1024), "1024 bytes");
  EXPECT_EQ(format_size(1536), "1.50 KiB");
  EXPECT_EQ(format_size(kMiB), "1024.00 KiB");
  EXPECT_EQ(format_size(20 * kMiB), "20.00 MiB");
  EXPECT_EQ(format_size(std::uint64_t{81008} << 20), "79.11 GiB");
}

// A random program of allocations and frees. After every step: the figures equal what the
// live blocks add up to; a block is its request rounded, plus at most what the rules leave
// unsplit; no two live blocks overlap; reserved stays within the capacity; pool figures
// add up to the aggregate. At the end, everything freed and the cache emptied, nothing is
// left.
RC_GTEST_PROP(CachingModel, FiguresFollowTheLiveBlocks, ()) {
  const std::size_t capacity = *rc::gen::inRange<std::size_t>(8, 256) * kMiB;
  CachingModel model(capacity);
  struct Live {
    CachingModel::Block* block;
    std::size_t requested;
  };
  std::vector<Live> live;
  const int steps = *rc::gen::inRange(1, 200);
  for (int step = 0; step < steps; ++step) {
    const bool allocate = live.empty() || *rc::gen::inRange(0, 3) != 0;
    if (allocate) {
      const std::size_t requested = *rc::gen::oneOf(rc::gen::inRange<std::size_t>(1, 4096),
                                                    rc::gen::inRange<std::size_t>(1, 2 * kMiB),
                                                    rc::gen::inRange<std::size_t>(kMiB, 24 * kMiB));
      OutOfMemory failure;
      const std::int64_t ooms = model.stats().num_ooms;
      CachingModel::Block* block = model.malloc(requested, &failure);
      if (block == nullptr) {
        RC_ASSERT(model.stats().num_ooms == ooms + 1);
        RC_ASSERT(failure.tried == segment_size(round_size(requested)));
        RC_ASSERT(failure.tried > failure.free);
        continue;
      }
      const std::size_t rounded = round_size(requested);
      const std::size_t size = CachingModel::size_of(block);
      RC_ASSERT(size >= rounded);
      RC_ASSERT(size - rounded < (rounded <= kSmallSize ? kMinBlockSize : kSmallSize + 1));
      live.push_back({block, requested});
    } else {
      const std::size_t index = *rc::gen::inRange<std::size_t>(0, live.size());
      model.free(live[index].block);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
    }
    std::int64_t allocated = 0, requested = 0, small = 0;
    std::vector<std::pair<std::uint64_t, std::size_t>> spans;
    for (const Live& l : live) {
      const std::size_t size = CachingModel::size_of(l.block);
      allocated += static_cast<std::int64_t>(size);
      requested += static_cast<std::int64_t>(l.requested);
      if (round_size(l.requested) <= kSmallSize) small += static_cast<std::int64_t>(size);
      spans.emplace_back(CachingModel::address_of(l.block), size);
    }
    const DeviceStats& stats = model.stats();
    RC_ASSERT(current(stats.allocated_bytes) == allocated);
    RC_ASSERT(current(stats.active_bytes) == allocated);
    RC_ASSERT(current(stats.requested_bytes) == requested);
    RC_ASSERT(current(stats.allocated_bytes, kSmall) == small);
    RC_ASSERT(current(stats.allocation) == static_cast<std::int64_t>(live.size()));
    RC_ASSERT(current(stats.reserved_bytes) == static_cast<std::int64_t>(model.reserved()));
    RC_ASSERT(model.reserved() <= capacity);
    RC_ASSERT(current(stats.allocated_bytes) + current(stats.inactive_split_bytes) <=
              current(stats.reserved_bytes));
    for (const auto* stat : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.segment,
                             &stats.inactive_split_bytes, &stats.requested_bytes}) {
      RC_ASSERT(current(*stat) == current(*stat, kSmall) + current(*stat, kLarge));
      RC_ASSERT((*stat)[kAll].peak >= current(*stat));
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) {
      RC_ASSERT(spans[i - 1].first + spans[i - 1].second <= spans[i].first);
    }
  }
  for (const Live& l : live) model.free(l.block);
  RC_ASSERT(current(model.stats().allocated_bytes) == 0);
  RC_ASSERT(current(model.stats().inactive_split) == 0);
  RC_ASSERT(current(model.stats().inactive_split_bytes) == 0);
  model.empty_cache();
  RC_ASSERT(model.reserved() == 0u);
  RC_ASSERT(current(model.stats().segment) == 0);
}

// A freed block serves the same request again: no new segment, the same block size.
RC_GTEST_PROP(CachingModel, AFreedBlockServesTheSameRequest, ()) {
  const std::size_t requested = *rc::gen::inRange<std::size_t>(1, 64 * kMiB);
  CachingModel model(std::size_t{1024} * kMiB);
  OutOfMemory failure;
  CachingModel::Block* first = model.malloc(requested, &failure);
  const std::size_t size = CachingModel::size_of(first);
  model.free(first);
  CachingModel::Block* again = model.malloc(requested, &failure);
  RC_ASSERT(model.stats().num_device_alloc == 1);
  RC_ASSERT(CachingModel::size_of(again) == size);
  RC_ASSERT(current(model.stats().reserved_bytes) ==
            static_cast<std::int64_t>(segment_size(round_size(requested))));
}

}  // namespace
}  // namespace sgpu::sim::memory
