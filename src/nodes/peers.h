// What this node makes of the other nodes' reports once its own ranks are gone (NOTE
// [Several nodes]): their ranks' rows for the one table, where their logs are, every
// rank's results in global rank order, and whether this node's success is the launch's.
// Apart from the link, so that every way a launch can end here is tested with no network.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/monitor.h"
#include "launcher/node_link.h"
#include "launcher/nodes.h"
#include "sgpu/errors.h"

namespace sgpu::launcher {

struct NodeReports {
  std::vector<RankFailure> rows;  // the other nodes' ranks
  std::vector<std::string> logs;  // where the other nodes keep their logs; who sent nothing
  bool node0_reported = true;     // false: node 0 sent no report, it shows nothing
  // Every rank's results, in global rank order: when the ranks return results and the
  // launch succeeded with every node's arrived.
  std::optional<std::vector<std::string>> results;
};

// `told`: NodeLink::exchange's, this node's own report among it. `mine`: this node's
// ranks' results, when they return results and were read (empty otherwise). A success
// here becomes kPeerFailed when another node's rank failed, a node sent no report, or a
// node's results did not arrive; any other verdict stands.
NodeReports hear_reports(const std::vector<NodeLink::Told>& told, const NodePlan& nodes, int gpus,
                         bool returns, std::vector<std::string> mine, Verdict& verdict);

}  // namespace sgpu::launcher
