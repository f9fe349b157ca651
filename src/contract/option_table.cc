#include "contract/option_table.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "sgpu/errors.h"

namespace sgpu::contract {
namespace {

[[noreturn]] void refuse_kind(const char* name, const char* kind) {
  throw ConfigError(std::string(name) + " takes " + kind);
}

template <class T>
const T& held_value(const OptionValue& value, const char* name, const char* kind) {
  if (const T* held = std::get_if<T>(&value)) return *held;
  refuse_kind(name, kind);
}

// A whole number within T's range.
template <class T>
T as_whole(const OptionValue& value, const char* name) {
  const long long number = held_value<long long>(value, name, "a whole number");
  if (number < static_cast<long long>(std::numeric_limits<T>::min()) ||
      static_cast<unsigned long long>(number) > std::numeric_limits<T>::max()) {
    throw ConfigError(std::string(name) + " is out of range, got " + std::to_string(number));
  }
  return static_cast<T>(number);
}

std::string as_text(const OptionValue& value, const char* name) {
  return held_value<std::string>(value, name, "text");
}

bool as_flag(const OptionValue& value, const char* name) {
  return held_value<bool>(value, name, "true or false");
}

std::chrono::milliseconds as_seconds(const OptionValue& value, const char* name) {
  return duration_of_seconds(held_value<double>(value, name, "seconds"));
}

Timeout as_timeout(const OptionValue& value, const char* name) {
  if (std::holds_alternative<std::monostate>(value)) return kNoTimeout;
  return timeout_of_seconds(held_value<double>(value, name, "seconds, or none"));
}

#define SGPU_SET(member, how) [](Options& o, const OptionValue& v) { o.member = how(v, #member); }

constexpr OptionRow kRows[] = {
    {"gpus", OptionType::kInt, "a positive int", "1", "", "--gpus", "ranks to start, one per GPU",
     SGPU_SET(gpus, as_whole<int>)},
    {"gpu_type", OptionType::kString, "a GPU type such as \"H100\"", "detected", "", "--gpu-type",
     "the GPU type the node must have: `\"H100\"`, `\"h100\"`, `\"A10\"`, ...",
     SGPU_SET(gpu_type, as_text)},
    {"timeout", OptionType::kTimeout,
     "seconds (a positive number; float('inf') is none), or None for no deadline", "3 hours", "",
     "--timeout", "deadline for the whole call, or none", SGPU_SET(timeout, as_timeout)},
    {"hang_timeout", OptionType::kTimeout,
     "seconds (a positive number), or None to never judge a call hung", "10 minutes",
     "SGPU_HANG_TIMEOUT", "--hang-timeout",
     "how long a collective may be in flight on a rank before the call is judged hung, or none",
     SGPU_SET(hang_timeout, as_timeout)},
    {"recorder_entries", OptionType::kInt, "a number of collectives (0: none recorded)", "2000", "",
     "", "collectives each rank's recorder keeps; 0 records none, and no call is judged hung",
     SGPU_SET(recorder_entries, as_whole<std::uint32_t>)},
    {"backend", OptionType::kString, "\"auto\", \"cuda\" or \"sim\"", "`\"auto\"`", "SGPU_BACKEND",
     "--backend",
     "`\"cuda\"`, `\"sim\"`, or `\"auto\"` (cuda when a GPU is visible; never falls back to sim)",
     SGPU_SET(backend, as_text)},
    {"sim_node", OptionType::kString, "a node spec such as \"8xH100\"", "`SGPU_SIM`, else `8xH100`",
     "SGPU_SIM", "", "the node `sim` pretends to be: `8xH100`, `4xH100+4xA10`, `2xH200:40GiB`",
     SGPU_SET(sim_node, as_text)},
    {"sim_faults", OptionType::kString, "a fault plan such as \"rank=1:segv@collective=3\"",
     "`SGPU_SIM_FAULTS`, else none", "SGPU_SIM_FAULTS", "",
     "faults for `sim` ranks: `rank=1:segv@collective=3`", SGPU_SET(sim_faults, as_text)},
    {"sim_transport", OptionType::kString, "\"shm\" or \"gloo\"",
     "`SGPU_SIM_TRANSPORT`, else `\"shm\"`", "SGPU_SIM_TRANSPORT", "",
     "how `sim` collectives travel: `\"shm\"` (shared memory) or `\"gloo\"`",
     SGPU_SET(sim_transport, as_text)},
    {"sim_compute", OptionType::kString, "\"values\" or \"shapes\"",
     "`SGPU_SIM_COMPUTE`, else `\"values\"`", "SGPU_SIM_COMPUTE", "--sim-compute",
     "what a Python rank on `sim` computes: `\"values\"`, or `\"shapes\"` (no data)",
     SGPU_SET(sim_compute, as_text)},
    {"sim_cuda", OptionType::kBool,
     "True (a rank's cuda devices are the simulated GPUs) or False (CPU)", "true", "SGPU_SIM_CUDA",
     "", "a Python rank's `cuda` devices on `sim` are the node's GPUs, served by the CPU",
     SGPU_SET(sim_cuda, as_flag)},
    {"runs_dir", OptionType::kString, "a folder", "`SGPU_RUNS_DIR`, else `$TMPDIR/sgpu-<uid>/runs`",
     "SGPU_RUNS_DIR", "--log-dir", "where run folders go", SGPU_SET(runs_dir, as_text)},
    {"keep_run_dir", OptionType::kBool, "True or False", "false", "", "--keep-run-dir",
     "keep the run folder after a success too (a failure's is always kept)",
     SGPU_SET(keep_run_dir, as_flag)},
    {"console_ranks", OptionType::kRanks, "a list of ranks, or None for all", "all", "", "--ranks",
     "ranks whose output the console shows (the logs keep all)",
     [](Options& o, const OptionValue& v) {
       if (std::holds_alternative<std::monostate>(v)) {
         o.console_ranks.reset();
       } else {
         o.console_ranks = held_value<std::vector<int>>(v, "console_ranks", "a list of ranks");
       }
     }},
    {"max_payload_bytes", OptionType::kInt, "a positive int", "256 MiB", "", "",
     "limit on the serialized arguments and on each rank's result",
     SGPU_SET(max_payload_bytes, as_whole<std::size_t>)},
    {"teardown_grace", OptionType::kSeconds, "seconds (not negative)", "5 s", "", "",
     "between SIGTERM and SIGKILL when ranks are torn down", SGPU_SET(teardown_grace, as_seconds)},
    {"start_method", OptionType::kString, "\"auto\", \"fork-server\" or \"exec\"", "fork server",
     "SGPU_START_METHOD", "", "how ranks start: `\"fork-server\"` or `\"exec\"`",
     [](Options& o, const OptionValue& v) {
       const std::string method = as_text(v, "start_method");
       o.start_method = method == "exec"          ? StartMethod::kExec
                        : method == "fork-server" ? StartMethod::kForkServer
                                                  : StartMethod::kAuto;
     }},
    {"name", OptionType::kString, "a name", "the function's symbol", "", "--run-name",
     "the call's name in errors and of its MLflow run", SGPU_SET(name, as_text)},
    {"tracking", OptionType::kBool, "True or False", "true", "SGPU_TRACKING", "--no-tracking",
     "record the call as an MLflow run", SGPU_SET(tracking, as_flag)},
    {"tracking_uri", OptionType::kString, "an MLflow tracking URI",
     "`MLFLOW_TRACKING_URI`, else MLflow's default (`sqlite:///mlflow.db`, or `./mlruns` when "
     "it holds runs)",
     "MLFLOW_TRACKING_URI", "", "the MLflow tracking server, database or file store",
     SGPU_SET(tracking_uri, as_text)},
    {"experiment", OptionType::kString, "an experiment name",
     "`MLFLOW_EXPERIMENT_NAME`, else `MLFLOW_EXPERIMENT_ID`, else `Default`",
     "MLFLOW_EXPERIMENT_NAME", "--experiment", "the MLflow experiment, created if missing",
     SGPU_SET(experiment, as_text)},
    {"nnodes", OptionType::kInt, "a number of nodes (0: from the engine, else 1)",
     "from the engine, else 1", "", "--nnodes", "nodes in the launch, each running the same call",
     SGPU_SET(nnodes, as_whole<int>)},
    {"node_rank", OptionType::kInt, "this node's place, 0 to nnodes-1 (-1: from the engine)",
     "from the engine, else 0", "", "--node-rank",
     "this node's place in the launch; node 0 hosts the store", SGPU_SET(node_rank, as_whole<int>)},
    {"rdzv_endpoint", OptionType::kString, "node 0's store as \"HOST[:PORT]\"", "from the engine",
     "", "--rdzv-endpoint", "node 0's store as `HOST[:PORT]` (port 29500 when left out)",
     SGPU_SET(rdzv_endpoint, as_text)},
    {"rdzv_id", OptionType::kString, "the launch's name, the same on every node",
     "from the engine, else derived", "", "--rdzv-id", "the launch's name, the same on every node",
     SGPU_SET(rdzv_id, as_text)},
    {"rdzv_timeout", OptionType::kSeconds, "seconds (a positive number) for every node to join",
     "10 minutes", "", "--rdzv-timeout", "how long every node has to join the launch",
     SGPU_SET(rdzv_timeout, as_seconds)},
};

#undef SGPU_SET

}  // namespace

std::span<const OptionRow> option_table() { return kRows; }

const OptionRow* find_option(std::string_view name) {
  for (const OptionRow& row : kRows) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

std::string options_markdown() {
  const auto code = [](std::string_view text) {
    return text.empty() ? std::string("—") : "`" + std::string(text) + "`";
  };
  std::string table =
      "| option | default | environment | `sgpu run` flag | what it is |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const OptionRow& row : kRows) {
    table += "| `" + std::string(row.name) + "` | " + std::string(row.shown_default) + " | " +
             code(row.env) + " | " + code(row.flag) + " | " + std::string(row.doc) + " |\n";
  }
  return table;
}

}  // namespace sgpu::contract
