// A node's place in a launch over several nodes (NOTE [Several nodes]): the flags, the
// engines' variables, Slurm's host lists, and what the nodes tell each other at the end.
#include "nodes/nodes.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <regex>

#include "serialize/node_report.h"
#include "sgpu/errors.h"

namespace sgpu::nodes {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string config_error(const Options& options, const EnvLookup& env) {
  try {
    plan_nodes(options, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Hostlist, ExpandsSlurmsCompressedForm) {
  EXPECT_EQ(expand_hostlist("n[1-3,7]"), (std::vector<std::string>{"n1", "n2", "n3", "n7"}));
  EXPECT_EQ(expand_hostlist("gpu-a,n[08-10],login"),
            (std::vector<std::string>{"gpu-a", "n08", "n09", "n10", "login"}));
  EXPECT_EQ(expand_hostlist("rack[1-2]-n[1,3]"),
            (std::vector<std::string>{"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"}));
  EXPECT_EQ(expand_hostlist("solo"), (std::vector<std::string>{"solo"}));
}

TEST(Hostlist, RefusesWhatIsNotAList) {
  for (const char* bad :
       {"n[1-3", "n1-3]", "n[]", "n[3-1]", "n[a-b]", "n1,", ",n1", "n[1-]", "n[0-99999999]"}) {
    EXPECT_THROW(expand_hostlist(bad), ConfigError) << bad;
  }
}

// Lists that name more hosts than any cluster has are refused before they are expanded
// (the decoders fuzz target found such lists taking gigabytes and seconds, or more memory
// than there is: many ranges in one bracket, behind another bracket, or many entries).
TEST(Hostlist, RefusesListsOfMoreThan65536HostsWithoutExpandingThem) {
  std::string ranges = "n[0-9][";
  for (int i = 0; i < 40; ++i) ranges += (i ? "," : "") + std::string("0-65535");
  ranges += "]";
  std::string entries;
  for (int i = 0; i < 300; ++i) entries += (i ? "," : "") + ("h" + std::to_string(i) + "[0-65535]");
  for (const std::string& list : {ranges, entries, std::string("a[0-255][0-255][0-1]")}) {
    try {
      expand_hostlist(list);
      ADD_FAILURE() << "expanded " << list.substr(0, 40);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("more than 65536 hosts"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(expand_hostlist("a[0-255][0-255]").size(), 65536u);
}

// The law: writing any hosts of one prefix as Slurm compresses them (sorted runs as
// ranges, zero padding kept) expands back to those hosts, in order.
RC_GTEST_PROP(Hostlist, CompressedRangesExpandToTheirHosts, ()) {
  const int width = *rc::gen::inRange(1, 4);
  std::vector<int> numbers = *rc::gen::unique<std::vector<int>>(rc::gen::inRange(0, 999));
  RC_PRE(!numbers.empty());
  std::sort(numbers.begin(), numbers.end());
  const auto padded = [&](int n) {
    std::string digits = std::to_string(n);
    if (static_cast<int>(digits.size()) < width) digits.insert(0, width - digits.size(), '0');
    return digits;
  };
  std::string list = "node[";
  std::vector<std::string> expected;
  for (std::size_t i = 0; i < numbers.size();) {
    std::size_t j = i;
    while (j + 1 < numbers.size() && numbers[j + 1] == numbers[j] + 1) ++j;
    list += (i == 0 ? "" : ",") + padded(numbers[i]) + (j > i ? "-" + padded(numbers[j]) : "");
    for (std::size_t m = i; m <= j; ++m) expected.push_back("node" + padded(numbers[m]));
    i = j + 1;
  }
  list += "]";
  RC_ASSERT(expand_hostlist(list) == expected);
}

TEST(Endpoint, HostPortAndDefaults) {
  EXPECT_EQ(parse_endpoint("n1:1234", 29500, "x"),
            std::make_pair(std::string("n1"), std::uint16_t{1234}));
  EXPECT_EQ(parse_endpoint("n1", 29500, "x"),
            std::make_pair(std::string("n1"), std::uint16_t{29500}));
  EXPECT_EQ(parse_endpoint("[fd00::1]:80", 29500, "x"),
            std::make_pair(std::string("fd00::1"), std::uint16_t{80}));
  for (const char* bad : {"", ":80", "n1:", "n1:0", "n1:65536", "n1:http", "fd00::1", "[fd00::1"}) {
    EXPECT_THROW(parse_endpoint(bad, 29500, "--rdzv-endpoint"), ConfigError) << bad;
  }
}

TEST(PlanNodes, OneNodeWhenNothingSaysOtherwise) {
  const NodePlan plan = plan_nodes(Options{}, env_of({}));
  EXPECT_EQ(plan.nnodes, 1);
  EXPECT_EQ(plan.node_rank, 0);
  EXPECT_TRUE(plan.engine.empty());
  EXPECT_FALSE(plan.several());
}

TEST(PlanNodes, TheFlagsAlone) {
  Options options;
  options.nnodes = 3;
  options.node_rank = 2;
  options.rdzv_endpoint = "10.0.0.1:4000";
  const NodePlan plan = plan_nodes(options, env_of({}));
  EXPECT_EQ(plan.nnodes, 3);
  EXPECT_EQ(plan.node_rank, 2);
  EXPECT_EQ(plan.host, "10.0.0.1");
  EXPECT_EQ(plan.port, 4000);
  EXPECT_EQ(plan.engine, "flags");
  EXPECT_EQ(plan.id, "sgpu-10.0.0.1-4000");  // the same on every node
}

TEST(PlanNodes, TorchrunsVariables) {
  const NodePlan plan = plan_nodes(Options{}, env_of({{"PET_NNODES", "2"},
                                                      {"PET_NODE_RANK", "1"},
                                                      {"PET_MASTER_ADDR", "trainer-0"},
                                                      {"PET_MASTER_PORT", "23456"}}));
  EXPECT_EQ(plan.nnodes, 2);
  EXPECT_EQ(plan.node_rank, 1);
  EXPECT_EQ(plan.host, "trainer-0");
  EXPECT_EQ(plan.port, 23456);
  EXPECT_EQ(plan.engine, "torchrun (PET_*)");
}

std::map<std::string, std::string> slurm_step() {
  return {{"SLURM_JOB_ID", "41"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEP_NUM_NODES", "3"},
          {"SLURM_STEP_NUM_TASKS", "3"},
          {"SLURM_STEP_NODELIST", "h[2-4]"},
          {"SLURMD_NODENAME", "h3"},
          {"SLURM_NODEID", "2"}};
}

TEST(PlanNodes, ASlurmStepPlacesTheNodeByItsOwnList) {
  const NodePlan plan = plan_nodes(Options{}, env_of(slurm_step()));
  EXPECT_EQ(plan.nnodes, 3);
  EXPECT_EQ(plan.node_rank, 1);  // h3 is the step's second node; SLURM_NODEID counts the job's
  EXPECT_EQ(plan.host, "h2");
  EXPECT_EQ(plan.engine, "Slurm");
  EXPECT_EQ(plan.id, "slurm-41.0");
  EXPECT_GE(plan.port, kDefaultRdzvPort);
  auto with_port = slurm_step();
  with_port["MASTER_PORT"] = "31000";
  EXPECT_EQ(plan_nodes(Options{}, env_of(with_port)).port, 31000);
}

TEST(PlanNodes, SlurmWithSeveralTasksPerNodeIsRefused) {
  auto env = slurm_step();
  env["SLURM_STEP_NUM_TASKS"] = "24";
  const std::string what = config_error(Options{}, env_of(env));
  EXPECT_NE(what.find("--ntasks-per-node=1"), std::string::npos) << what;
}

TEST(PlanNodes, OpenMpiAndPmi) {
  const NodePlan ompi = plan_nodes(
      Options{},
      env_of({{"OMPI_COMM_WORLD_SIZE", "2"},
              {"OMPI_COMM_WORLD_RANK", "1"},
              {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
              {"OMPI_MCA_orte_hnp_uri", "3735879680.0;tcp://10.9.0.1,172.17.0.2:41257"}}));
  EXPECT_EQ(ompi.nnodes, 2);
  EXPECT_EQ(ompi.node_rank, 1);
  EXPECT_EQ(ompi.host, "10.9.0.1");  // mpirun's daemon, unless MASTER_ADDR says
  EXPECT_EQ(ompi.engine, "Open MPI");
  EXPECT_EQ(ompi.id, "ompi-3735879680.0");
  const std::string per_node =
      config_error(Options{}, env_of({{"OMPI_COMM_WORLD_SIZE", "16"},
                                      {"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}}));
  EXPECT_NE(per_node.find("-npernode 1"), std::string::npos) << per_node;
  const NodePlan pmi =
      plan_nodes(Options{}, env_of({{"PMI_SIZE", "2"}, {"PMI_RANK", "0"}, {"MASTER_ADDR", "a"}}));
  EXPECT_EQ(pmi.engine, "PMI");
  EXPECT_EQ(pmi.host, "a");
  const std::string nowhere =
      config_error(Options{}, env_of({{"PMI_SIZE", "2"}, {"PMI_RANK", "0"}}));
  EXPECT_NE(nowhere.find("node 0's address"), std::string::npos) << nowhere;
}

// What a process on node 1 of `salloc -N2 mpirun -npernode 1` carries: mpirun started its
// daemon there with a one-node srun step.
TEST(PlanNodes, MpirunInsideASlurmAllocationIsPlacedByOpenMpi) {
  const auto env = env_of({{"OMPI_COMM_WORLD_SIZE", "2"},
                           {"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                           {"OMPI_MCA_ess_base_jobid", "2833776641"},
                           {"OMPI_MCA_orte_hnp_uri", "2833776640.0;tcp://10.213.0.1:42141"},
                           {"SLURM_STEP_NODELIST", "h1"},
                           {"SLURM_STEP_NUM_NODES", "1"},
                           {"SLURM_STEP_NUM_TASKS", "1"},
                           {"SLURM_NODEID", "0"},
                           {"SLURM_JOB_ID", "1"}});
  const NodePlan plan = plan_nodes(Options{}, env);
  EXPECT_EQ(plan.engine, "Open MPI");
  EXPECT_EQ(plan.nnodes, 2);
  EXPECT_EQ(plan.node_rank, 1);
  EXPECT_EQ(plan.host, "10.213.0.1");
  EXPECT_EQ(plan.id, "ompi-2833776641");
  // Not the daemon's port: one of its own, the same on every node of the job.
  EXPECT_EQ(plan.port, kDefaultRdzvPort + 2833776641LL % 4000);
}

TEST(PlanNodes, AFlagThatContradictsTheEngineIsAConfigError) {
  Options options;
  options.node_rank = 0;
  const std::string what = config_error(options, env_of(slurm_step()));
  EXPECT_NE(what.find("contradicts Slurm"), std::string::npos) << what;
  EXPECT_NE(what.find("SLURMD_NODENAME=h3"), std::string::npos) << what;
  options.node_rank = -1;
  options.nnodes = 2;
  EXPECT_NE(config_error(options, env_of(slurm_step())).find("SLURM_STEP_NUM_NODES=3"),
            std::string::npos);
  // What agrees is fine, and an explicit endpoint is used as given.
  options.nnodes = 3;
  options.node_rank = 1;
  options.rdzv_endpoint = "10.1.1.1:5000";
  const NodePlan plan = plan_nodes(options, env_of(slurm_step()));
  EXPECT_EQ(plan.host, "10.1.1.1");
  EXPECT_EQ(plan.port, 5000);
}

TEST(PlanNodes, BadPlacesAreConfigErrors) {
  Options options;
  options.nnodes = 2;
  EXPECT_NE(config_error(options, env_of({})).find("needs this node's place"), std::string::npos);
  options.node_rank = 2;
  EXPECT_NE(config_error(options, env_of({})).find("is not below the 2 nodes"), std::string::npos);
  options.node_rank = 1;
  EXPECT_NE(config_error(options, env_of({})).find("needs node 0's address"), std::string::npos);
  EXPECT_NE(config_error(Options{}, env_of({{"PET_NNODES", "two"}})).find("PET_NNODES=two"),
            std::string::npos);
}

TEST(NodeReport, RoundTripsEveryField) {
  serialize::NodeReport report;
  report.node_rank = 1;
  report.host = "h3";
  report.run_dir = "/tmp/runs/x";
  RankFailure row;
  row.rank = 3;
  row.local_rank = 1;
  row.node_rank = 1;
  row.host = "h3";
  row.pid = 4242;
  row.kind = RankFailure::Kind::kExitCode;
  row.exit_code = 7;
  row.message = "m\xff";  // not UTF-8: replaced, never a lost report
  row.stderr_tail = "boom\n";
  row.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(1764660000123));
  RankFailure killed = row;
  killed.rank = 2;
  killed.kind = RankFailure::Kind::kSignal;
  killed.exit_code.reset();
  killed.signal = 9;
  report.rows = {row, killed};
  const serialize::NodeReport back =
      serialize::parse_node_report(serialize::node_report_json(report));
  EXPECT_EQ(back.node_rank, 1);
  EXPECT_EQ(back.host, "h3");
  EXPECT_EQ(back.run_dir, report.run_dir);
  ASSERT_EQ(back.rows.size(), 2u);
  EXPECT_EQ(back.rows[0].rank, 3);
  EXPECT_EQ(back.rows[0].local_rank, 1);
  EXPECT_EQ(back.rows[0].pid, 4242);
  EXPECT_EQ(back.rows[0].kind, RankFailure::Kind::kExitCode);
  EXPECT_EQ(back.rows[0].exit_code, 7);
  EXPECT_FALSE(back.rows[0].signal);
  EXPECT_EQ(back.rows[0].stderr_tail, "boom\n");
  EXPECT_EQ(back.rows[0].time, row.time);
  EXPECT_EQ(back.rows[1].signal, 9);
  EXPECT_FALSE(back.rows[1].exit_code);
  std::string huge = serialize::node_report_json(report);
  huge.replace(huge.find("\"time_ns\":") + 10, 13, "171000001710000000000");  // no integer holds it
  const std::string far_pid = std::regex_replace(serialize::node_report_json(report),
                                                 std::regex("\"pid\":4242"), "\"pid\":4294967296");
  for (const std::string& bad :
       {std::string(), std::string("{}"), std::string("[1]"),
        std::string(R"({"node":1,"host":"h","run_dir":"d","rows":[{}]})"), huge, far_pid}) {
    EXPECT_THROW(serialize::parse_node_report(bad), std::invalid_argument) << bad;
  }
}

// What node 0 tells the others of the call's run round-trips, an untracked launch's (no run)
// too; what is no such run is refused, never taken for one.
TEST(SharedRun, RoundTripsAndRefusesWhatIsNoRun) {
  const serialize::SharedRun run{"sqlite:////shared/mlflow.db", "7", "0123abcd"};
  const serialize::SharedRun back = serialize::parse_shared_run(serialize::shared_run_json(run));
  EXPECT_EQ(back.uri, run.uri);
  EXPECT_EQ(back.experiment_id, "7");
  EXPECT_EQ(back.run_id, "0123abcd");
  const serialize::SharedRun none = serialize::parse_shared_run(serialize::shared_run_json({}));
  EXPECT_EQ(none.run_id, "");
  for (const char* bad :
       {"", "{}", "uri\n7\nrun", R"({"uri":1,"experiment_id":"7","run_id":"r"})"}) {
    EXPECT_THROW(serialize::parse_shared_run(bad), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace sgpu::nodes
