// What a node of a launch over several nodes tells node 0 once its ranks are gone
// (nodes/node_link.h): its host, its run folder and one row per rank; and what node 0 tells
// the others of the call's run before any rank starts. A report's JSON:
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

// The call's MLflow run as node 0 shares it with the other nodes, whose ranks log into it
// (tracking::CallRun::Shared). JSON: {"uri": ..., "experiment_id": ..., "run_id": ...}; an
// untracked launch shares an empty run_id.
struct SharedRun {
  std::string uri;
  std::string experiment_id;
  std::string run_id;
};

std::string shared_run_json(const SharedRun& run);
// Throws std::invalid_argument for anything that is not such a run.
SharedRun parse_shared_run(std::string_view json);

}  // namespace sgpu::serialize
