#include "contract/rank_env.h"

#include <cstdlib>
#include <sstream>

#include "contract/node_memory.h"
#include "contract/option_table.h"

namespace sgpu::contract {

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
  env.master_addr = env_string(kMasterAddrVar);
  env.master_port = static_cast<int>(env_int(kMasterPortVar, env.master_port));
  env.role = env_string(kRoleVar);
  env.call_file = env_string(kCallFileVar);
  env.rank_dir = env_string(kRankDirVar);
  env.device_index = static_cast<int>(env_int(kDeviceVar, env.device_index));
  env.backend = env_string(kBackendVar);
  env.parent_pid = static_cast<long>(env_int(kParentVar, env.parent_pid));
  env.lifeline_fd = static_cast<int>(env_int(kLifelineVar, env.lifeline_fd));
  env.group_timeout =
      std::chrono::milliseconds(env_int(kGroupTimeoutVar, env.group_timeout.count()));
  env.recorder_entries = env_int(kRecorderEntriesVar, env.recorder_entries);
  return env;
}

std::string python_rank_names() {
  struct Name {
    const char* python;
    const char* value;
  };
  static constexpr Name kVariables[] = {
      {"ROLE", kRoleVar},
      {"RANK_DIR", kRankDirVar},
      {"DEVICE_INDEX", kDeviceVar},
      {"RANK_BACKEND", kBackendVar},
      {"SUPERVISOR_PID", kSupervisorVar},
      {"SIM_COMPUTE", kSimComputeVar},
      {"NODE_MEMORY", kNodeMemoryVar},
  };
  static constexpr Name kBackends[] = {
      {"CUDA_BACKEND", kCudaBackend},
      {"SIM_BACKEND", kSimBackend},
  };
  // The settings the startup hook reads before any native code: the option table's variables.
  static constexpr Name kSettings[] = {
      {"BACKEND_SETTING", "backend"},
      {"SIM_NODE_SETTING", "sim_node"},
      {"SIM_CUDA_SETTING", "sim_cuda"},
  };
  static constexpr Name kRoles[] = {
      {"RANK_ROLE", kRankRole},
      {"PROGRAM_ROLE", kProgramRole},
      {"WORKER_ROLE", kWorkerRole},
      {"FORK_SERVER_ROLE", kForkServerRole},
  };
  std::ostringstream out;
  out << "\"\"\"The variables sgpu's launcher starts a rank with, the roles SGPU_ROLE names and\n"
         "the backends' names (NOTE [The rank environment] in src/contract/rank_env.h), and the\n"
         "option table's variables for the settings read before the native module loads, for\n"
         "Python that may not load it: `import sgpu`, the interpreter's startup hook. Made\n"
         "from that contract (contract::python_rank_names()), which contract_test keeps this\n"
         "file equal to. It imports nothing.\"\"\"\n\n";
  for (const Name& name : kVariables) out << name.python << " = \"" << name.value << "\"\n";
  out << "\n# What SGPU_ROLE says a process is.\n";
  for (const Name& name : kRoles) out << name.python << " = \"" << name.value << "\"\n";
  out << "\n# The backends' names, as SGPU_RANK_BACKEND gives them.\n";
  for (const Name& name : kBackends) out << name.python << " = \"" << name.value << "\"\n";
  out << "\n# The variables of the settings read before the native module loads.\n";
  for (const Name& name : kSettings) {
    out << name.python << " = \"" << find_option(name.value)->env << "\"\n";
  }
  // A row of the settings' table (NOTE [Settings]), which the hook reads before it can load
  // sgpu.
  out << "SERVERLESS_GPU_SETTING = \"" << setting_row("SGPU_SERVERLESS_GPU").env << "\"\n";
  return out.str();
}

}  // namespace sgpu::contract
