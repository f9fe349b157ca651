// How many sgpu::HostMemory scopes are open on this thread (sgpu/memory.h): the simulated
// device's allocator counts no allocation made while one is.
#pragma once

namespace sgpu::contract {

inline int& host_memory_depth() {
  thread_local int depth = 0;
  return depth;
}

}  // namespace sgpu::contract
