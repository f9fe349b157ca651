// A rank's environment (launcher/rank_environment.h), with no process: the caller's own
// variables pass on, the rank's are set over them and never beside them, and a call of
// several ranks runs each rank's operators on one thread unless the caller said otherwise.
#include "launcher/rank_environment.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace {

using sgpu::launcher::rank_process_environment;
using sgpu::launcher::RankEnvironmentPlan;

// An environ-style array over `entries` (which must outlive it).
std::vector<char*> environ_of(std::vector<std::string>& entries) {
  std::vector<char*> pointers;
  for (std::string& entry : entries) pointers.push_back(entry.data());
  pointers.push_back(nullptr);
  return pointers;
}

// How many times each name is set, and its first value (what getenv reads).
struct Read {
  std::map<std::string, int> count;
  std::map<std::string, std::string> value;
};
Read read(const std::vector<std::string>& env) {
  Read out;
  for (const std::string& entry : env) {
    const std::string name = entry.substr(0, entry.find('='));
    if (out.count[name]++ == 0) out.value[name] = entry.substr(entry.find('=') + 1);
  }
  return out;
}

RankEnvironmentPlan plan_of(int rank, int world) {
  RankEnvironmentPlan plan;
  plan.rank.rank = rank;
  plan.rank.world_size = world;
  plan.rank.backend = "sim";
  plan.run_id = "run-7";
  return plan;
}

TEST(RankEnvironment, TheCallersVariablesPassOnAndTheRanksReplaceTheirNames) {
  std::vector<std::string> caller{"HOME=/home/u", "RANK=5", "WORLD_SIZE=16",
                                  "SGPU_SIM_TRANSPORT=ib", "TORCHELASTIC_RUN_ID=outer"};
  RankEnvironmentPlan plan = plan_of(1, 2);
  plan.backend = {"SGPU_SIM_TRANSPORT=gloo", "SGPU_SIM=2xH100"};
  plan.tracking = {{"SGPU_TRACKING", "off"}};
  plan.program = {{"TORCHELASTIC_ERROR_FILE", "/runs/x/rank-1/error.json"}};
  const Read env = read(rank_process_environment(plan, environ_of(caller).data()));
  EXPECT_EQ(env.value.at("HOME"), "/home/u");
  EXPECT_EQ(env.value.at("RANK"), "1");  // a caller that is itself a torchrun worker
  EXPECT_EQ(env.value.at("WORLD_SIZE"), "2");
  EXPECT_EQ(env.value.at("TORCHELASTIC_RUN_ID"), "run-7");
  // What the launcher resolved (NOTE [The option table]), not the caller's variable.
  EXPECT_EQ(env.value.at("SGPU_SIM_TRANSPORT"), "gloo");
  EXPECT_EQ(env.value.at("SGPU_SIM"), "2xH100");
  EXPECT_EQ(env.value.at("SGPU_TRACKING"), "off");
  EXPECT_EQ(env.value.at("TORCHELASTIC_ERROR_FILE"), "/runs/x/rank-1/error.json");
  EXPECT_EQ(env.value.at("SGPU_RANK_BACKEND"), "sim");
  for (const auto& [name, times] : env.count) EXPECT_EQ(times, 1) << name;
}

TEST(RankEnvironment, SeveralRanksRunOnOneThreadEachUnlessTheCallerSaidOtherwise) {
  std::vector<std::string> none{"HOME=/home/u"};
  EXPECT_EQ(read(rank_process_environment(plan_of(0, 2), environ_of(none).data()))
                .value.at("OMP_NUM_THREADS"),
            "1");
  EXPECT_EQ(read(rank_process_environment(plan_of(0, 1), environ_of(none).data()))
                .count.count("OMP_NUM_THREADS"),
            0u);  // one rank has the node's cores
  std::vector<std::string> set{"OMP_NUM_THREADS=4"};
  const Read env = read(rank_process_environment(plan_of(0, 2), environ_of(set).data()));
  EXPECT_EQ(env.value.at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(env.count.at("OMP_NUM_THREADS"), 1);
}

TEST(RankEnvironment, NoCallerEnvironmentIsTheRanksVariablesAlone) {
  const std::vector<std::string> env = rank_process_environment(plan_of(0, 1), nullptr);
  EXPECT_FALSE(env.empty());
  EXPECT_TRUE(std::all_of(env.begin(), env.end(), [](const std::string& entry) {
    return entry.find('=') != std::string::npos;
  }));
}

}  // namespace
