// A rank's device memory, in the vocabulary of torch.cuda.memory_stats().
//
// On cuda the figures are the CUDA caching allocator's; on sim they are the simulated
// device's (NOTE [Simulated device memory] in sim/memory/caching_model.h): what a rank
// allocates for its device counts against that device's capacity, and past it the
// allocation fails with CUDA's out-of-memory error (c10::OutOfMemoryError).
//
//   {
//     sgpu::HostMemory host;  // this batch is host memory, as on a GPU node
//     batch = loader.next();
//   }
//   const sgpu::MemoryStats stats = sgpu::memory_stats();
//   stats.at("allocated_bytes.all.peak");
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace sgpu {

// torch.cuda.memory_stats()'s keys and values: "allocated_bytes.all.current",
// "reserved_bytes.large_pool.peak", "num_ooms", ...
using MemoryStats = std::map<std::string, std::int64_t>;

// This rank's device memory figures; empty outside a rank, and on sim when the simulated
// device does not count memory (SGPU_SIM_MEMORY=off).
MemoryStats memory_stats();

// Every ".peak" figure of this rank starts again from its current value, as
// torch.cuda.reset_peak_memory_stats() does: the peak of one phase (a training step)
// rather than of the whole rank. Nothing outside a rank.
void reset_peak_memory_stats();

// While one lives, the CPU tensors this thread allocates are host memory: on sim they do
// not count against the simulated device (on cuda, CPU tensors never do). For data
// loading and other buffers that a GPU node keeps on the host.
class HostMemory {
 public:
  HostMemory();
  ~HostMemory();
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
};

}  // namespace sgpu
