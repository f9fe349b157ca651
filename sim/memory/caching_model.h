// NOTE [Simulated device memory]
// A simulated GPU's memory is a model of PyTorch's CUDA caching allocator in its default
// configuration (c10/cuda/CUDACachingAllocator.cpp: no expandable segments, no
// max_split_size, one stream), kept beside the host memory that really holds the data:
// - a request rounds up to a multiple of 512 B (512 B at least);
// - requests up to 1 MiB are served from the small pool, whose segments are 2 MiB; larger
//   ones from the large pool, whose segments are 20 MiB for requests under 10 MiB and the
//   request rounded up to 2 MiB otherwise;
// - a request takes the smallest cached free block of its pool that fits (the lowest
//   address among equals); a block is split when what remains is at least 512 B (small
//   pool) or more than 1 MiB (large pool);
// - a freed block merges with free neighbours of its segment and returns to its pool;
// - when a new segment does not fit in the capacity, every cached segment that is wholly
//   free is released and the segment tried again (num_alloc_retries); if it still does
//   not fit, the allocation fails (num_ooms) and nothing else changes.
// Segments are the "reserved" memory; the capacity is what the device offers PyTorch
// (torch's "total capacity"). The statistics are the caching allocator's DeviceStats,
// kept as it keeps them, so sgpu::memory_stats() reads the same on sim and on cuda.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <utility>
#include <vector>

namespace sgpu::sim::memory {

inline constexpr std::size_t kMinBlockSize = 512;
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;
inline constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kRoundLarge = std::size_t{2} << 20;
inline constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;

// The caching allocator's rounding of a request.
std::size_t round_size(std::size_t requested);
// The size of the segment a rounded request that no cached block serves asks for.
std::size_t segment_size(std::size_t rounded);

using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;

// Why an allocation failed, in the figures CUDA's message gives.
struct OutOfMemory {
  std::size_t tried = 0;  // the segment it asked the device for
  std::uint64_t capacity = 0;
  std::uint64_t free = 0;  // capacity less what is reserved, by every process that shares it
  std::int64_t allocated = 0;
  std::int64_t reserved = 0;
  std::vector<std::pair<long, std::uint64_t>> others;  // other processes' holdings: pid, bytes
};

// A device's capacity shared with other processes (NOTE [A node's shared device memory] in
// src/contract/node_memory.h): every new segment is taken from it too, and given back when
// released.
class SharedCapacity {
 public:
  virtual ~SharedCapacity() = default;
  virtual bool take(std::uint64_t bytes) = 0;  // false: no room left among the processes
  virtual void give(std::uint64_t bytes) = 0;
  virtual std::uint64_t free() = 0;  // what no process holds
  virtual std::vector<std::pair<long, std::uint64_t>> others() = 0;
};

class CachingModel {
 public:
  struct Block;

  explicit CachingModel(std::uint64_t capacity);
  ~CachingModel();
  CachingModel(const CachingModel&) = delete;
  CachingModel& operator=(const CachingModel&) = delete;

  // The block serving a request of `requested` bytes (more than zero), or nullptr with
  // `*failure` filled in when the device has no room for it.
  Block* malloc(std::size_t requested, OutOfMemory* failure);
  void free(Block* block);
  // Releases every cached segment that is wholly free (torch.cuda.empty_cache()).
  void empty_cache();
  // Every peak starts again from its current value (torch.cuda.reset_peak_memory_stats()).
  void reset_peak_stats();
  // Every accumulated figure starts again from zero
  // (torch.cuda.reset_accumulated_memory_stats()).
  void reset_accumulated_stats();
  // What the device offers from now on; segments already held stay held.
  void set_capacity(std::uint64_t capacity) { capacity_ = capacity; }
  // From now on, segments come from `shared` too (nullptr: this process's alone). Set it
  // before the first allocation: what is held already was not taken from it.
  void share(SharedCapacity* shared) { shared_ = shared; }
  // What this process may still reserve: its capacity less its segments, and no more than
  // what no process holds where the capacity is shared.
  std::uint64_t free_bytes() const;

  const DeviceStats& stats() const { return stats_; }
  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t reserved() const { return reserved_; }
  // The block's size as the allocator hands it out (at least the rounded request).
  static std::size_t size_of(const Block* block);
  // The simulated device address of the block.
  static std::uint64_t address_of(const Block* block);
  // A pointer the block's holder keeps with it while it is allocated.
  static void set_holder_data(Block* block, void* data);
  static void* holder_data(const Block* block);

 private:
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BySize>;

  Block* find_free(Pool& pool, std::size_t size);
  Block* new_segment(Pool& pool, std::size_t size);
  void release_free_segments(Pool& pool);
  Block* take(Block* block, std::size_t size, std::size_t requested);
  void merge(Block* into, Block* other, Pool& pool, std::int64_t* subsumed);
  Block* new_block();
  void delete_block(Block* block);

  std::uint64_t capacity_;
  SharedCapacity* shared_ = nullptr;
  std::uint64_t reserved_ = 0;
  std::uint64_t next_address_ = 0;
  Pool small_;
  Pool large_;
  std::deque<Block> arena_;    // every block there was; addresses stay put as it grows
  std::vector<Block*> spare_;  // blocks of the arena merged or released, to reuse
  DeviceStats stats_;
};

}  // namespace sgpu::sim::memory
