#include "sgpu/memory.h"

#include "backend/backend_table.h"
#include "contract/host_memory.h"
#include "contract/rank_env.h"
#include "sgpu/runtime.h"

namespace sgpu {

MemoryStats memory_stats() {
  if (!is_rank()) return {};
  const contract::RankEnvironment env = contract::read_rank_environment();
  return backend::rank_backend(env).memory_stats(env.device_index);
}

void reset_peak_memory_stats() {
  if (!is_rank()) return;
  const contract::RankEnvironment env = contract::read_rank_environment();
  backend::rank_backend(env).reset_peak_memory_stats(env.device_index);
}

HostMemory::HostMemory() { ++contract::host_memory_depth(); }

HostMemory::~HostMemory() { --contract::host_memory_depth(); }

}  // namespace sgpu
