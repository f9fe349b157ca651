// NOTE [The rank environment]
// The variables a rank starts with. The launcher writes them (RankEnvironment::variables,
// over the caller's environment), and code in the rank reads them only through
// read_rank_environment(): the rank helpers (sgpu::global_rank() ...), the process group,
// the simulated backend's fault plan, the rank logger; Python that may not load the native
// module, by the names python_rank_names() gives it. The rank's place has torchrun's
// names (and DeepSpeed's launcher's), so programs written for torchrun run unchanged; the
// rest is SGPU_*.
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace sgpu::contract {

// The fd number the caller's lifeline has in every rank process (NOTE [Abrupt ends]): a
// rank watches it, and end-of-file there means the caller is gone.
inline constexpr int kRankLifelineFd = 3;
// How many of a rank's last output lines the caller keeps for the call's error: what a
// rank writes as it crashes (its backtrace's frames) is held within them.
inline constexpr std::size_t kRankTailLines = 20;

// torchrun's.
// What sim ranks compute, "values" or "shapes" (Options::sim.compute): the simulated
// backend's, read here too by the launcher, which takes "shapes" for Python ranks only.
inline constexpr const char* kSimComputeVar = "SGPU_SIM_COMPUTE";
inline constexpr const char* kRankVar = "RANK";
inline constexpr const char* kLocalRankVar = "LOCAL_RANK";
inline constexpr const char* kGroupRankVar = "GROUP_RANK";
inline constexpr const char* kRoleRankVar = "ROLE_RANK";
inline constexpr const char* kWorldSizeVar = "WORLD_SIZE";
inline constexpr const char* kLocalWorldSizeVar = "LOCAL_WORLD_SIZE";
inline constexpr const char* kNodeRankVar = "NODE_RANK";
inline constexpr const char* kGroupWorldSizeVar = "GROUP_WORLD_SIZE";  // nodes
inline constexpr const char* kRoleWorldSizeVar = "ROLE_WORLD_SIZE";
inline constexpr const char* kMasterAddrVar = "MASTER_ADDR";
inline constexpr const char* kMasterPortVar = "MASTER_PORT";
// DeepSpeed's launcher's: the ranks on this node, the node's place, the nodes.
inline constexpr const char* kLocalSizeVar = "LOCAL_SIZE";
inline constexpr const char* kCrossRankVar = "CROSS_RANK";
inline constexpr const char* kCrossSizeVar = "CROSS_SIZE";
// sgpu's own.
inline constexpr const char* kRoleVar = "SGPU_ROLE";                      // one of the roles below
inline constexpr const char* kCallFileVar = "SGPU_CALL_FILE";             // the staged call.bin
inline constexpr const char* kRankDirVar = "SGPU_RANK_DIR";               // rank-<N>/
inline constexpr const char* kDeviceVar = "SGPU_DEVICE_INDEX";            // device to bind
inline constexpr const char* kBackendVar = "SGPU_RANK_BACKEND";           // resolved backend name
inline constexpr const char* kParentVar = "SGPU_PARENT_PID";              // expected parent
inline constexpr const char* kLifelineVar = "SGPU_LIFELINE_FD";           // lifeline read end
inline constexpr const char* kGroupTimeoutVar = "SGPU_GROUP_TIMEOUT_MS";  // collectives
inline constexpr const char* kRecorderEntriesVar = "SGPU_RECORDER_ENTRIES";  // collective ring
// The collective model's platform the ring's predicted times are on (a name or a file;
// NOTE [The collective model]); the sim backend sets it from its node spec, a user may set
// it for any backend.
inline constexpr const char* kPlatformVar = "SGPU_PLATFORM";
// In a program `sgpu run` started: its rank's supervisor, the program's parent. The program
// itself (not what it starts) arms its stack dumps when it imports sgpu (NOTE [Stack dumps]).
inline constexpr const char* kSupervisorVar = "SGPU_SUPERVISOR_PID";
// Under `sgpu sim`: the node's folder, where the processes on the node that sgpu did not
// start record the process groups they form (NOTE [A node's worlds] in
// launcher/node_watch.h).
inline constexpr const char* kNodeDirVar = "SGPU_NODE_DIR";

// The backends' names: what Options::backend chooses and SGPU_RANK_BACKEND says.
inline constexpr const char* kCudaBackend = "cuda";
inline constexpr const char* kSimBackend = "sim";

// What SGPU_ROLE says a process is: a C++ function's rank, a program's (`sgpu run`'s), a
// Python function's rank (sgpu's worker), the fork server that starts ranks.
inline constexpr const char* kRankRole = "rank";
inline constexpr const char* kProgramRole = "program";
inline constexpr const char* kWorkerRole = "worker";
inline constexpr const char* kForkServerRole = "fork-server";

struct RankEnvironment {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int group_world_size = 1;  // nodes in the launch
  std::string master_addr;
  int master_port = 0;
  std::string role;  // one of the roles above
  std::filesystem::path call_file;
  std::filesystem::path rank_dir;
  int device_index = 0;
  std::string backend;
  long parent_pid = 0;
  int lifeline_fd = -1;
  std::chrono::milliseconds group_timeout{std::chrono::minutes(30)};
  long long recorder_entries = 0;  // the collective ring's size (NOTE [The collective ring])

  // NAME, value for every variable above, torchrun's GROUP_RANK, ROLE_RANK and
  // ROLE_WORLD_SIZE and DeepSpeed's LOCAL_SIZE, CROSS_RANK and CROSS_SIZE included.
  std::vector<std::pair<std::string, std::string>> variables() const;
};

// This process's rank environment; a field whose variable is unset or empty keeps its
// default.
RankEnvironment read_rank_environment();

// The integer in environment variable `name`, or `fallback` when it is unset or empty.
long long env_int(const char* name, long long fallback);

// The value of environment variable `name`, or "" when it is unset.
std::string env_string(const char* name);

// The text of python/_sgpu_rank_env.py: the variables and roles above that Python reads, by
// name, for code that may not load the native module (`import sgpu`, the interpreter's
// startup hook). contract_test keeps the file equal to it.
std::string python_rank_names();

}  // namespace sgpu::contract
