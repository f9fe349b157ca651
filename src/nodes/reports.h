// What this node makes of the other nodes' reports once its own ranks are gone (NOTE
// [Several nodes]): their ranks' rows for the one table, where their logs are, every
// rank's results in global rank order, and whether this node's success is the launch's.
// Apart from the link, so that every way a launch can end here is tested with no network.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nodes/node_link.h"
#include "nodes/nodes.h"
#include "sgpu/errors.h"

namespace sgpu::nodes {

struct NodeReports {
  std::vector<RankFailure> rows;  // the other nodes' ranks
  std::vector<std::string> logs;  // where the other nodes keep their logs; who sent nothing
  bool node0_reported = true;     // false: node 0 sent no report, it shows nothing
  // Every rank's results, in global rank order: when the ranks return results and the
  // launch succeeded with every node's arrived.
  std::optional<std::vector<std::string>> results;
  // Why a launch that succeeded here fails after all: another node's rank failed, a node
  // sent no report, or a node's results did not arrive (the first found). Empty when none
  // of these, and when the launch failed here: a failure here stands.
  std::string peer_failure;
};

// `told`: NodeLink::exchange's, this node's own report among it. `mine`: this node's
// ranks' results, when they return results and were read (empty otherwise).
// `succeeded_here`: whether the launch succeeded on this node.
NodeReports hear_reports(const std::vector<NodeLink::Told>& told, const NodePlan& nodes, int gpus,
                         bool returns, std::vector<std::string> mine, bool succeeded_here);

}  // namespace sgpu::nodes
