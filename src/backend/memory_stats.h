// A caching allocator's DeviceStats as torch.cuda.memory_stats() names them: the one
// spelling of sgpu::MemoryStats, for the cuda backend (the CUDA caching allocator's own
// figures) and the simulated one (sim/memory).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <string>

#include "sgpu/memory.h"

namespace sgpu::backend {

inline MemoryStats memory_stats_of(const c10::CachingDeviceAllocator::DeviceStats& stats) {
  MemoryStats out;
  const auto add_stat = [&](const std::string& name, const c10::CachingAllocator::Stat& stat) {
    out[name + ".current"] = stat.current;
    out[name + ".peak"] = stat.peak;
    out[name + ".allocated"] = stat.allocated;
    out[name + ".freed"] = stat.freed;
  };
  const auto add_array = [&](const std::string& name,
                             const c10::CachingAllocator::StatArray& array) {
    add_stat(name + ".all", array[0]);
    add_stat(name + ".small_pool", array[1]);
    add_stat(name + ".large_pool", array[2]);
  };
  add_array("allocation", stats.allocation);
  add_array("segment", stats.segment);
  add_array("active", stats.active);
  add_array("inactive_split", stats.inactive_split);
  add_array("allocated_bytes", stats.allocated_bytes);
  add_array("reserved_bytes", stats.reserved_bytes);
  add_array("active_bytes", stats.active_bytes);
  add_array("inactive_split_bytes", stats.inactive_split_bytes);
  add_array("requested_bytes", stats.requested_bytes);
  add_stat("oversize_allocations", stats.oversize_allocations);
  add_stat("oversize_segments", stats.oversize_segments);
  out["num_alloc_retries"] = stats.num_alloc_retries;
  out["num_ooms"] = stats.num_ooms;
  out["max_split_size"] = stats.max_split_size;
  out["num_sync_all_streams"] = stats.num_sync_all_streams;
  out["num_device_alloc"] = stats.num_device_alloc;
  out["num_device_free"] = stats.num_device_free;
  return out;
}

}  // namespace sgpu::backend
