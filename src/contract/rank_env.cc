#include "contract/rank_env.h"

#include <cstdlib>

namespace sgpu::contract {
namespace {

std::string env_text(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

std::string env_string(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

long long env_int(const char* name, long long fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoll(value) : fallback;
}

std::vector<std::pair<std::string, std::string>> RankEnvironment::variables() const {
  return {
      {kRankVar, std::to_string(rank)},
      {kLocalRankVar, std::to_string(local_rank)},
      {kGroupRankVar, std::to_string(node_rank)},
      {kRoleRankVar, std::to_string(rank)},
      {kWorldSizeVar, std::to_string(world_size)},
      {kLocalWorldSizeVar, std::to_string(local_world_size)},
      {kNodeRankVar, std::to_string(node_rank)},
      {kGroupWorldSizeVar, std::to_string(group_world_size)},
      {kRoleWorldSizeVar, std::to_string(world_size)},
      {kMasterAddrVar, master_addr},
      {kMasterPortVar, std::to_string(master_port)},
      {kLocalSizeVar, std::to_string(local_world_size)},
      {kCrossRankVar, std::to_string(node_rank)},
      {kCrossSizeVar, std::to_string(group_world_size)},
      {kRoleVar, role},
      {kCallFileVar, call_file.string()},
      {kRankDirVar, rank_dir.string()},
      {kDeviceVar, std::to_string(device_index)},
      {kBackendVar, backend},
      {kParentVar, std::to_string(parent_pid)},
      {kLifelineVar, std::to_string(lifeline_fd)},
      {kGroupTimeoutVar, std::to_string(group_timeout.count())},
      {kRecorderEntriesVar, std::to_string(recorder_entries)},
  };
}

RankEnvironment read_rank_environment() {
  RankEnvironment env;
  env.rank = static_cast<int>(env_int(kRankVar, env.rank));
  env.local_rank = static_cast<int>(env_int(kLocalRankVar, env.local_rank));
  env.world_size = static_cast<int>(env_int(kWorldSizeVar, env.world_size));
  env.local_world_size = static_cast<int>(env_int(kLocalWorldSizeVar, env.local_world_size));
  env.node_rank = static_cast<int>(env_int(kNodeRankVar, env.node_rank));
  env.group_world_size = static_cast<int>(env_int(kGroupWorldSizeVar, env.group_world_size));
  env.master_addr = env_text(kMasterAddrVar);
  env.master_port = static_cast<int>(env_int(kMasterPortVar, env.master_port));
  env.role = env_text(kRoleVar);
  env.call_file = env_text(kCallFileVar);
  env.rank_dir = env_text(kRankDirVar);
  env.device_index = static_cast<int>(env_int(kDeviceVar, env.device_index));
  env.backend = env_text(kBackendVar);
  env.parent_pid = static_cast<long>(env_int(kParentVar, env.parent_pid));
  env.lifeline_fd = static_cast<int>(env_int(kLifelineVar, env.lifeline_fd));
  env.group_timeout =
      std::chrono::milliseconds(env_int(kGroupTimeoutVar, env.group_timeout.count()));
  env.recorder_entries = env_int(kRecorderEntriesVar, env.recorder_entries);
  return env;
}

}  // namespace sgpu::contract
