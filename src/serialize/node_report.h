// What a node of a launch over several nodes tells node 0 once its ranks are gone
// (nodes/node_link.h): its host, its run folder and one row per rank. JSON:
//   {"node": K, "host": ..., "run_dir": ..., "rows": [{"rank": ..., "kind": "exit code", ...}]}
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "sgpu/errors.h"

namespace sgpu::serialize {

struct NodeReport {
  int node_rank = 0;
  std::string host;
  std::filesystem::path run_dir;
  std::vector<RankFailure> rows;  // root_cause is not carried: the reader decides it
};

std::string node_report_json(const NodeReport& report);
// Throws std::invalid_argument for anything that is not such a report.
NodeReport parse_node_report(std::string_view json);

}  // namespace sgpu::serialize
