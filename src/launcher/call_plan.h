// Steps 1-3 of a call (docs/architecture.md, "The life of one call"): the options checked
// and resolved, this node's place, the backend chosen, the devices selected, the hang
// timeout and the start method settled. Nothing is started or written; a ConfigError or
// AcceleratorMismatchError says why the call cannot be. Once made, a plan does not change.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "backend/selection.h"
#include "launcher/rank_program.h"
#include "nodes/nodes.h"
#include "sgpu/options.h"

namespace sgpu::launcher {

// What each option's value must be on its own (gpus at least 1, timeouts positive, ...),
// in the caller's spelling: ConfigError. Step 1 checks it with the rest; the Python
// decorator, as it is applied.
void check_option_values(const Options& options);

// Step 1: the options as given, as the SGPU_* variables set them (contract::with_environment,
// NOTE [The option table]), their durations within the clocks, with this node's place
// (nnodes, node_rank), checked. `nodes` is plan_nodes(given).
Options resolve_options(const Options& given, const nodes::NodePlan& nodes);

struct CallPlan {
  Options options;  // resolve_options's
  // When a collective is judged hung (the options' hang_timeout); nullopt: never, as when
  // the ranks keep no collective ring.
  Timeout hang_timeout;
  StartMethod method = StartMethod::kExec;
  std::string backend;                   // its name
  std::vector<std::string> backend_env;  // what the backend sets in every rank
  backend::Selection selection;          // the devices, on this node
  std::string sim_node;                  // the simulated node's spec; empty on a real one
  // A folded world's nodes (NOTE [A folded world] in sim/fold.h): this one launch, node 0's
  // ranks, stands for that many; 1 for a launch that does not fold.
  int folded_nodes = 1;
};

// Steps 2-3 for `program`'s ranks under resolved `options`, in a world of `folded_nodes`
// nodes where the launch folds them (CallPlan::folded_nodes).
CallPlan plan_call(Options options, const RankProgram& program, int folded_nodes = 1);

// The options as the backend sees them: a folded launch's (one node's launch) with the
// whole world's nodes, so that it knows the world its ranks stand in.
Options world_options(Options options, int folded_nodes);

// Where calls' run folders go: Options::runs_dir (SGPU_RUNS_DIR stands in for it:
// contract::with_environment), else $TMPDIR/sgpu-<uid>/runs.
std::filesystem::path runs_dir(const Options& options);

// A new, empty run folder of this call's under runs_dir(options).
std::filesystem::path make_run_dir(const Options& options);

// A program as execvp would find it: a path with a '/', else the first match on PATH. A
// ConfigError naming it, before anything starts, when there is none to run.
void check_runnable(const std::string& program);

}  // namespace sgpu::launcher
