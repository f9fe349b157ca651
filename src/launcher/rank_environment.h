// A rank process's environment: the caller's own, with the rank's variables set over it
// (NOTE [The rank environment] in contract/rank_env.h). A variable the caller has under one
// of the rank's names (a caller that is itself a torchrun worker, or one with SGPU_SIM set
// that the launcher resolved) is replaced, never passed on beside it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "contract/rank_env.h"

namespace sgpu::launcher {

struct RankEnvironmentPlan {
  using Variables = std::vector<std::pair<std::string, std::string>>;

  contract::RankEnvironment rank;  // the contract's variables, torchrun's among them
  std::string run_id;              // TORCHELASTIC_RUN_ID: the launch's, the same on every node
  // Set after the contract's, in this order: the kind of rank's own, the tracking's, then
  // the backend's ("NAME=value", as Backend::rank_environment gives them).
  Variables program;
  Variables tracking;
  std::vector<std::string> backend;
};

// The rank's environment as "NAME=value" entries: `caller` (an environ-style array, null
// terminated; nullptr for none) without the names the plan sets, then the plan's
// variables. A call of several ranks sets OMP_NUM_THREADS=1 unless the caller set it.
std::vector<std::string> rank_process_environment(const RankEnvironmentPlan& plan, char** caller);

}  // namespace sgpu::launcher
