#include "sgpu/runtime.h"

#include <cstdlib>

#include "backend/backend_table.h"
#include "launcher/fork_server.h"
#include "launcher/program.h"
#include "launcher/rank_main.h"

namespace sgpu {
namespace {

int env_int(const char* name, int fallback) {
  return static_cast<int>(launcher::env_int(name, fallback));
}

}  // namespace

void init(int argc, char** argv) {
  launcher::set_program_args(argc, argv);
  if (launcher::started_as_rank()) launcher::run_rank();
  if (launcher::started_as("program")) launcher::run_program(argv);
  if (launcher::started_as_fork_server()) launcher::run_fork_server();
}

bool is_rank() { return launcher::started_as_rank(); }

int global_rank() { return is_rank() ? env_int("RANK", 0) : 0; }
int local_rank() { return is_rank() ? env_int("LOCAL_RANK", 0) : 0; }
int world_size() { return is_rank() ? env_int("WORLD_SIZE", 1) : 1; }
int local_world_size() { return is_rank() ? env_int("LOCAL_WORLD_SIZE", 1) : 1; }
int node_rank() { return is_rank() ? env_int("NODE_RANK", 0) : 0; }

std::string device() {
  if (!is_rank()) return "cpu";
  const char* backend = std::getenv(launcher::kBackendVar);
  return backend::find_backend(backend != nullptr ? backend : "sim")
      .device(env_int(launcher::kDeviceVar, 0));
}

}  // namespace sgpu
