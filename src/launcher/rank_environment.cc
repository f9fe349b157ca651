#include "launcher/rank_environment.h"

#include <algorithm>
#include <string_view>

namespace sgpu::launcher {

std::vector<std::string> rank_process_environment(const RankEnvironmentPlan& plan, char** caller) {
  RankEnvironmentPlan::Variables vars = plan.rank.variables();
  // PyTorch's env:// rendezvous joins the caller's store instead of hosting one.
  vars.insert(vars.end(), {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                           {"TORCHELASTIC_RESTART_COUNT", "0"},
                           {"TORCHELASTIC_RUN_ID", plan.run_id}});
  vars.insert(vars.end(), plan.program.begin(), plan.program.end());
  vars.insert(vars.end(), plan.tracking.begin(), plan.tracking.end());
  for (const std::string& var : plan.backend) {
    const auto eq = var.find('=');
    vars.emplace_back(var.substr(0, eq), var.substr(eq + 1));
  }
  std::vector<std::string> env;
  bool caller_sets_threads = false;
  for (char** entry = caller; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view var(*entry);
    const std::string_view name = var.substr(0, var.find('='));
    caller_sets_threads = caller_sets_threads || name == "OMP_NUM_THREADS";
    if (std::none_of(vars.begin(), vars.end(), [&](const auto& v) { return v.first == name; })) {
      env.emplace_back(var);
    }
  }
  if (plan.rank.world_size > 1 && !caller_sets_threads) {
    env.emplace_back("OMP_NUM_THREADS=1");
  }
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

}  // namespace sgpu::launcher
