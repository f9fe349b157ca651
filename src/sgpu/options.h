// sgpu::Options: what one distributed call asks for.
//
// Every field has a default that a user can rely on; Options are checked before anything
// starts, and a bad value is a ConfigError that names the field. Environment variables
// fill in the fields they name when those are left empty (SGPU_SIM, SGPU_RUNS_DIR), or
// override them (SGPU_BACKEND, SGPU_START_METHOD, SGPU_TRACKING=off).
#pragma once

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sgpu {

// A deadline for the whole call. std::nullopt means no deadline.
using Timeout = std::optional<std::chrono::milliseconds>;
inline constexpr Timeout kNoTimeout = std::nullopt;
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::hours(3);
// How long a collective may stay in flight on a rank before the call is judged hung
// (docs/errors.md, "When a call hangs", says why 10 minutes).
inline constexpr std::chrono::milliseconds kDefaultHangTimeout = std::chrono::minutes(10);

// The longest duration sgpu keeps as a number: 100 years. A deadline that far out is no
// deadline; longer ones would overflow the clocks' nanoseconds (292 years), so they are
// taken as none (a timeout) or as this (a duration that must have a value).
inline constexpr std::chrono::milliseconds kLongestDuration = std::chrono::hours(24 * 36525);

// A timeout of `seconds`: +infinity and anything past kLongestDuration are no deadline;
// other values (zero and negatives included, which the options' checks refuse) to the
// millisecond. Throws std::invalid_argument for NaN.
inline Timeout timeout_of_seconds(double seconds) {
  if (std::isnan(seconds)) throw std::invalid_argument("a timeout of NaN seconds");
  const double milliseconds = seconds * 1000;
  if (milliseconds > static_cast<double>(kLongestDuration.count())) return kNoTimeout;
  if (milliseconds < -static_cast<double>(kLongestDuration.count())) {
    return -kLongestDuration;  // refused as not positive, but as a number that reads
  }
  return std::chrono::milliseconds(std::llround(milliseconds));
}

// A duration of `seconds` that must have a value (a grace, a join timeout): NaN throws
// std::invalid_argument, anything past kLongestDuration (+infinity too) is kLongestDuration.
inline std::chrono::milliseconds duration_of_seconds(double seconds) {
  const Timeout timeout = timeout_of_seconds(seconds);
  return timeout ? *timeout : kLongestDuration;
}

// A timeout as a command line gives it: "none", or seconds (fractions, "inf" and exponents
// allowed: timeout_of_seconds judges them). Throws std::invalid_argument for anything else,
// NaN included. The options' checks judge the value.
inline Timeout parse_timeout(const std::string& text) {
  if (text == "none") return kNoTimeout;
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);  // past a double's range: +-inf
  if (text.empty() || end != text.c_str() + text.size() || std::isspace(text[0])) {
    throw std::invalid_argument("\"" + text + "\" is not a number of seconds");
  }
  return timeout_of_seconds(seconds);
}

// How rank processes start. kForkServer (what kAuto means) forks each rank from a warm
// copy of the caller's binary, started once per caller, so the binary's load time is paid
// once; kExec runs the binary anew for every rank, for programs whose static initialisers
// start threads (the fork server refuses to fork then, and says so).
enum class StartMethod { kAuto, kForkServer, kExec };

// What the simulated backend ("sim") takes; the cuda backend takes none of it. Each has a
// row of the option table named sim_<field> (the Python keyword and the error's spelling).
struct SimOptions {
  std::string node;       // the node it pretends, e.g. "8xH100"; empty: SGPU_SIM, else "8xH100"
  std::string faults;     // fault plan for its ranks (see sim/faults.h); empty: SGPU_SIM_FAULTS
  std::string transport;  // its collectives: "shm" (shared memory) or "gloo"; empty:
                          // SGPU_SIM_TRANSPORT, else "shm"
  std::string compute;    // what its ranks compute: "values" (the default) or "shapes": a
                          // Python rank's tensors carry shapes and no data, and its
                          // collectives move no bytes (docs/simulation.md, "Shape-only
                          // compute"); empty: SGPU_SIM_COMPUTE, else "values"
  bool fold = false;      // in shape-only compute over several simulated nodes, only node 0's
                          // ranks run, each standing for its place on every node (NOTE [A
                          // folded world]); SGPU_SIM_FOLD=on|off overrides
  bool cuda = true;       // a Python rank's cuda devices are the node's GPUs served by the CPU;
                          // false: CPU devices, as a C++ rank's; SGPU_SIM_CUDA=on|off overrides
};

// Who asks for the call, so that the advice in its errors names a setting as the caller
// writes it: as a field of Options (kCpp, what a C++ program leaves), as a flag of the sgpu
// command (kCommand), or as a keyword of the Python decorator (kPython). The sgpu command
// and the Python package set it; no keyword, flag or variable does.
enum class FrontEnd { kCpp, kCommand, kPython };

struct Options {
  int gpus = 1;                                // ranks to start, one per GPU
  std::string gpu_type;                        // e.g. "H100" (case-insensitive); empty: detected
  Timeout timeout = kDefaultTimeout;           // kNoTimeout for none
  Timeout hang_timeout = kDefaultHangTimeout;  // a collective in flight this long on any rank
                                               // ends the call with HangError; kNoTimeout:
                                               // never; SGPU_HANG_TIMEOUT (seconds or none)
                                               // overrides
  std::uint32_t recorder_entries = 2000;       // collectives each rank's recorder keeps; 0: none
                                               // (and no hang diagnosis)
  std::string backend = "auto";                // "auto", "cuda" or "sim"; SGPU_BACKEND overrides
  SimOptions sim;                              // what the sim backend takes
  std::filesystem::path runs_dir;              // where run folders go; empty: SGPU_RUNS_DIR, else
                                               // $TMPDIR/sgpu-<uid>/runs
  bool keep_run_dir = false;                   // keep the run folder after success too
  std::optional<std::vector<int>> console_ranks;  // ranks streamed to the console; unset: all
  std::size_t max_payload_bytes = std::size_t{256} << 20;  // limit on arguments and each result
  std::chrono::milliseconds teardown_grace = std::chrono::seconds(5);  // SIGTERM -> SIGKILL
  StartMethod start_method = StartMethod::kAuto;  // SGPU_START_METHOD=fork-server|exec overrides
  std::string name;  // shown in logs and errors; empty: the function's name
  // Experiment tracking (docs/tracking.md): each call is an MLflow run.
  bool tracking = true;      // false: no run, nothing written; SGPU_TRACKING=off does the same
  std::string tracking_uri;  // http(s)://server, sqlite:///path.db or file:/path; empty:
                             // MLFLOW_TRACKING_URI, else MLflow's own default: ./mlruns when
                             // it holds runs already, else sqlite:///mlflow.db
  std::string experiment;    // experiment name, created if missing; empty:
                             // MLFLOW_EXPERIMENT_NAME, else MLFLOW_EXPERIMENT_ID, else Default
  // Several nodes (docs/cli.md, "Several nodes"): the same launch on every node, each with its
  // own node_rank, meeting at node 0's store. Left unset they come from the engine this
  // process runs under (torchrun's PET_* variables, a Slurm step, Open MPI or PMI), else
  // the launch is this node alone. On the sim backend, with neither a node rank, an endpoint,
  // an id nor an engine, a Python distributed function runs every node of `nnodes` (or of
  // `gpus` over its simulated node's) in its caller's process (docs/python.md).
  int nnodes = 0;             // nodes in the launch; 0: detected, else 1
  int node_rank = -1;         // this node's place, 0 to nnodes-1; -1: detected
  std::string rdzv_endpoint;  // HOST[:PORT] of node 0's store (port 29500 when left out);
                              // node 0 listens on HOST's address
  std::string rdzv_id;        // the launch's name, the same on every node; empty: derived
  std::chrono::milliseconds rdzv_timeout = std::chrono::minutes(10);  // for every node to join
  FrontEnd front_end = FrontEnd::kCpp;  // how errors name the settings (above)
};

// The folder run folders go in: Options::runs_dir, else SGPU_RUNS_DIR, else
// $TMPDIR/sgpu-<uid>/runs (/tmp when TMPDIR is unset).
std::filesystem::path runs_dir_of(const Options& options);

}  // namespace sgpu
