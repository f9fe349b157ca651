// The other nodes as a call sees them (launcher/peers.h), with no network: a launch on one
// node hosts its own store and closes it, hears from no one and shows its rows plainly; over
// several nodes the error's text shows every rank on node 0 and a node's own elsewhere.
#include "launcher/peers.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "launcher/failure_table.h"

namespace sgpu::launcher {
namespace {

bool accepts_connections(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &address.sin_addr);
  const bool connected =
      ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return connected;
}

RankFailure row(int rank, int node, RankFailure::Kind kind, bool root_cause = false) {
  RankFailure r;
  r.rank = rank;
  r.local_rank = rank % 2;
  r.node_rank = node;
  r.host = "n" + std::to_string(node);
  r.kind = kind;
  r.root_cause = root_cause;
  return r;
}

TEST(OneNode, HostsItsOwnStoreUntilItClosesAndHearsFromNoOne) {
  const std::unique_ptr<Peers> peers = one_node();
  EXPECT_FALSE(peers->plan().several());
  peers->open();
  EXPECT_EQ(peers->store_host(), "127.0.0.1");
  const int port = peers->store_port();
  EXPECT_GT(port, 0);
  EXPECT_TRUE(accepts_connections("127.0.0.1", port));
  EXPECT_EQ(peers->run_id("/runs/train-20261207-1"), "train-20261207-1");
  EXPECT_EQ(peers->hear_every(), Clock::duration::max());
  EXPECT_EQ(peers->failure(), std::nullopt);

  Verdict verdict{Outcome::kSucceeded, "", std::nullopt};
  bool asked = false;
  peers->exchange(
      verdict, true,
      [&](bool) {
        asked = true;
        return NodeEnd{};
      },
      [] { return false; });
  EXPECT_EQ(verdict.outcome, Outcome::kSucceeded);
  EXPECT_FALSE(asked);  // nobody to tell: the ranks' results are not read for it
  EXPECT_EQ(peers->take_results(), std::nullopt);
  EXPECT_TRUE(peers->rows().empty());
  peers->close();
  EXPECT_FALSE(accepts_connections("127.0.0.1", port));  // closed before the call ends
}

TEST(OneNode, ShowsItsRowsPlainly) {
  const std::unique_ptr<Peers> peers = one_node();
  RankFailure placed = row(1, 0, RankFailure::Kind::kOk);
  placed.host = "";
  peers->place(placed);
  EXPECT_EQ(placed.host, "");  // no node to name
  EXPECT_EQ(peers->launch_nodes(), 1);
  EXPECT_EQ(peers->whose_ranks(), "any rank");
  const std::vector<RankFailure> rows = {row(0, 0, RankFailure::Kind::kExitCode, true)};
  EXPECT_EQ(peers->failure_text("failed", rows, "/runs/x"),
            format_failure("failed", rows, "/runs/x"));
  EXPECT_EQ(peers->share_run(nullptr, true), nullptr);
}

nodes::NodePlan node(int rank) {
  nodes::NodePlan plan;
  plan.nnodes = 2;
  plan.node_rank = rank;
  plan.host = "n0";
  return plan;
}

TEST(NodesFailureText, Node0ShowsEveryRankAndWhereTheOthersKeepTheirLogs) {
  const std::vector<RankFailure> rows = {
      row(0, 0, RankFailure::Kind::kTerminated), row(1, 0, RankFailure::Kind::kTerminated),
      row(2, 1, RankFailure::Kind::kExitCode, true), row(3, 1, RankFailure::Kind::kTerminated)};
  const std::string text = nodes_failure_text("failed", rows, "/runs/x", node(0),
                                              {"logs of node 1 (n1): /runs/y"}, true);
  EXPECT_EQ(text, format_failure("failed", rows, "/runs/x") + "\nlogs of node 1 (n1): /runs/y");
}

TEST(NodesFailureText, AnotherNodeShowsItsOwnRanksAndTheRootCause) {
  const std::vector<RankFailure> rows = {
      row(0, 0, RankFailure::Kind::kSignal, true), row(1, 0, RankFailure::Kind::kTerminated),
      row(2, 1, RankFailure::Kind::kTerminated), row(3, 1, RankFailure::Kind::kTerminated)};
  const std::vector<RankFailure> shown = {rows[0], rows[2], rows[3]};
  EXPECT_EQ(nodes_failure_text("failed", rows, "/runs/y", node(1), {}, true),
            format_failure("failed\nnode 0 (n0) shows every rank of the launch", shown, "/runs/y"));
  EXPECT_EQ(nodes_failure_text("failed", rows, "/runs/y", node(1), {}, false),
            format_failure("failed\nnode 0 (n0) is gone; this node's ranks:", shown, "/runs/y"));
}

}  // namespace
}  // namespace sgpu::launcher
