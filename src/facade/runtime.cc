#include "sgpu/runtime.h"

#include "backend/backend_table.h"
#include "contract/rank_env.h"
#include "launcher/fork_server.h"
#include "rank/program.h"
#include "rank/rank_main.h"

namespace sgpu {
namespace {

int rank_env_int(const char* name, int fallback) {
  return static_cast<int>(contract::env_int(name, fallback));
}

}  // namespace

void init(int argc, char** argv) {
  rank::set_program_args(argc, argv);
  if (rank::started_as_rank()) rank::run_rank();
  if (rank::started_as(contract::kProgramRole)) rank::run_program(argv);
  if (launcher::started_as_fork_server()) launcher::run_fork_server();
}

// A function's rank, or a worker's (a Python rank: launcher.h, WorkerCall).
bool is_rank() { return rank::started_as_rank() || rank::started_as(contract::kWorkerRole); }

// Outside a rank, the caller is rank 0 of a world of one on the CPU. Each reads its own
// variable only: user code may call these every step.
int global_rank() { return is_rank() ? rank_env_int(contract::kRankVar, 0) : 0; }
int local_rank() { return is_rank() ? rank_env_int(contract::kLocalRankVar, 0) : 0; }
int world_size() { return is_rank() ? rank_env_int(contract::kWorldSizeVar, 1) : 1; }
int local_world_size() { return is_rank() ? rank_env_int(contract::kLocalWorldSizeVar, 1) : 1; }
int node_rank() { return is_rank() ? rank_env_int(contract::kNodeRankVar, 0) : 0; }

std::string device() {
  if (!is_rank()) return "cpu";
  const contract::RankEnvironment env = contract::read_rank_environment();
  return backend::rank_backend(env).device(env.device_index);
}

}  // namespace sgpu
