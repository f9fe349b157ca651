// What a node makes of the other nodes' reports (nodes/reports.h), with no network: every
// way a launch that succeeded here can still fail elsewhere, and the results gathered in
// global rank order only when every node's arrived.
#include "nodes/reports.h"

#include <gtest/gtest.h>

#include "sgpu/internal/values.h"

namespace {

using sgpu::RankFailure;
using sgpu::nodes::hear_reports;
using sgpu::nodes::NodeLink;
using sgpu::nodes::NodePlan;

constexpr int kGpus = 2;

// Node `node`'s report: its two ranks, ok unless `failed`, and their results when it
// published them.
NodeLink::Told report(int node, bool published = true, bool failed = false) {
  NodeLink::Told told;
  told.report.node_rank = node;
  told.report.host = "n" + std::to_string(node);
  told.report.run_dir = "/runs/node" + std::to_string(node);
  std::vector<std::string> results;
  for (int local = 0; local < kGpus; ++local) {
    RankFailure row;
    row.rank = node * kGpus + local;
    row.kind = failed && local == 1 ? RankFailure::Kind::kExitCode : RankFailure::Kind::kOk;
    told.report.rows.push_back(row);
    results.push_back("r" + std::to_string(row.rank));
  }
  if (published) told.results = sgpu::serialize::to_bytes(results);
  return told;
}

NodePlan node(int rank, int nnodes = 3) {
  NodePlan plan;
  plan.nnodes = nnodes;
  plan.node_rank = rank;
  return plan;
}

std::vector<std::string> mine(int node) {
  return {"r" + std::to_string(node * kGpus), "r" + std::to_string(node * kGpus + 1)};
}

constexpr bool kSucceededHere = true;

TEST(NodeReports, EveryNodesResultsAreGatheredInGlobalRankOrder) {
  const auto heard = hear_reports({report(0), report(1), report(2)}, node(1), kGpus, true, mine(1),
                                  kSucceededHere);
  EXPECT_EQ(heard.peer_failure, "");
  ASSERT_TRUE(heard.results.has_value());
  EXPECT_EQ(*heard.results, (std::vector<std::string>{"r0", "r1", "r2", "r3", "r4", "r5"}));
  EXPECT_EQ(heard.rows.size(), 4u);  // the other two nodes' ranks
  EXPECT_EQ(heard.logs, (std::vector<std::string>{"logs of node 0 (n0): /runs/node0",
                                                  "logs of node 2 (n2): /runs/node2"}));
  EXPECT_TRUE(heard.node0_reported);
}

TEST(NodeReports, ARankThatFailedElsewhereFailsALaunchThatSucceededHere) {
  const auto heard = hear_reports({report(0), report(1, true, true), report(2)}, node(0), kGpus,
                                  true, mine(0), kSucceededHere);
  EXPECT_EQ(heard.peer_failure, "node 1 (n1) failed after this node's ranks had finished");
  EXPECT_FALSE(heard.results.has_value());
}

TEST(NodeReports, ANodeThatSentNoReportIsNamedAndFailsTheLaunch) {
  const auto heard =
      hear_reports({report(1), report(2)}, node(1), kGpus, true, mine(1), kSucceededHere);
  EXPECT_EQ(heard.peer_failure, "node 0 sent no report: its sgpu is gone");
  EXPECT_FALSE(heard.results.has_value());
  EXPECT_FALSE(heard.node0_reported);
  EXPECT_EQ(heard.logs.back(), "node 0 sent no report: its sgpu is gone");
}

TEST(NodeReports, ResultsThatDidNotArriveFailTheLaunchOnlyWhereRanksReturnResults) {
  const auto function =
      hear_reports({report(0), report(1, false)}, node(0, 2), kGpus, true, mine(0), kSucceededHere);
  EXPECT_EQ(function.peer_failure,
            "node 1 (n1)'s ranks finished, but their results did not reach this node; its logs "
            "say more");
  EXPECT_FALSE(function.results.has_value());
  // A program's ranks return nothing.
  const auto program = hear_reports({report(0, false), report(1, false)}, node(0, 2), kGpus, false,
                                    {}, kSucceededHere);
  EXPECT_EQ(program.peer_failure, "");
  EXPECT_FALSE(program.results.has_value());
}

TEST(NodeReports, AFailureHereStandsWhateverTheOthersSay) {
  const auto heard = hear_reports({report(0), report(1, true, true)}, node(0, 3), kGpus, true,
                                  mine(0), !kSucceededHere);
  EXPECT_EQ(heard.peer_failure, "");  // the failure here is the launch's
  EXPECT_FALSE(heard.results.has_value());
  EXPECT_EQ(heard.rows.size(), 2u);
  EXPECT_EQ(heard.logs.back(), "node 2 sent no report: its sgpu is gone");
}

}  // namespace
