#include "nodes/reports.h"

#include <exception>
#include <utility>

#include "sgpu/internal/values.h"

namespace sgpu::nodes {
namespace {

std::string node_name(int node, const std::string& host) {
  return "node " + std::to_string(node) + " (" + host + ")";
}

// A launch that succeeded here fails for `why`, the first reason found; a failure here
// stands.
void peer_failed(NodeReports& heard, bool succeeded_here, std::string why) {
  if (succeeded_here && heard.peer_failure.empty()) heard.peer_failure = std::move(why);
}

// A node's published results; empty when it published none or bytes that hold none.
std::vector<std::string> results_of(const std::optional<std::string>& published) {
  if (!published) return {};
  try {
    return serialize::from_bytes<std::vector<std::string>>(*published);
  } catch (const std::exception&) {  // cereal's
    return {};
  }
}

}  // namespace

NodeReports hear_reports(const std::vector<NodeLink::Told>& told, const NodePlan& nodes, int gpus,
                         bool returns, std::vector<std::string> mine, bool succeeded_here) {
  NodeReports heard;
  const auto nnodes = static_cast<std::size_t>(nodes.nnodes);
  std::vector<bool> reported(nnodes, false);
  std::vector<std::vector<std::string>> results(nnodes);
  const bool mine_read = mine.size() == static_cast<std::size_t>(gpus);
  results[static_cast<std::size_t>(nodes.node_rank)] = std::move(mine);
  std::string missing_results;
  for (const auto& [report, published] : told) {
    if (report.node_rank < 0 || report.node_rank >= nodes.nnodes) continue;
    const auto node = static_cast<std::size_t>(report.node_rank);
    reported[node] = true;
    if (report.node_rank == nodes.node_rank) continue;
    const std::string name = node_name(report.node_rank, report.host);
    if (returns) {
      results[node] = results_of(published);
      if (results[node].size() != static_cast<std::size_t>(gpus) && missing_results.empty()) {
        missing_results = name;
      }
    }
    heard.logs.push_back("logs of " + name + ": " + report.run_dir.string());
    for (const RankFailure& row : report.rows) {
      heard.rows.push_back(row);
      if (row.kind != RankFailure::Kind::kOk) {
        peer_failed(heard, succeeded_here, name + " failed after this node's ranks had finished");
      }
    }
  }
  heard.node0_reported = reported[0];
  for (int node = 0; node < nodes.nnodes; ++node) {
    if (reported[static_cast<std::size_t>(node)]) continue;
    const std::string gone = "node " + std::to_string(node) + " sent no report: its sgpu is gone";
    heard.logs.push_back(gone);
    peer_failed(heard, succeeded_here, gone);
  }
  if (returns && !missing_results.empty()) {
    peer_failed(heard, succeeded_here,
                missing_results +
                    "'s ranks finished, but their results did not reach this node; its "
                    "logs say more");
  }
  if (returns && succeeded_here && heard.peer_failure.empty() && mine_read) {
    heard.results.emplace();
    for (auto& node_results : results) {
      for (std::string& result : node_results) heard.results->push_back(std::move(result));
    }
  }
  return heard;
}

}  // namespace sgpu::nodes
