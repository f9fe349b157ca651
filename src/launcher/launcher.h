// The launcher: steps 1-12 of a call (docs/architecture.md, "The life of one call").
//
// start_call and start_program check the options and the node, create the call's MLflow
// run and run folder, stage the call and start its ranks, then return a handle whose
// monitor thread streams output, watches exits, the deadline, signals and the caller,
// tears down on the first failure and gathers the results. Both throw ConfigError or
// AcceleratorMismatchError before anything starts. The public templates reach them
// through the seam in sgpu/internal/call.h (src/facade/call.cc).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/interrupt.h"
#include "sgpu/internal/call.h"
#include "sgpu/internal/call_record.h"
#include "sgpu/options.h"

namespace sgpu::launcher {

// A distributed function's call: every rank runs `record`'s function.
std::shared_ptr<detail::Call> start_call(const Options& options, serialize::CallRecord record);

// `command` (a program and its arguments, found on PATH) as every rank; success is every
// rank exiting 0.
std::shared_ptr<detail::Call> start_program(const Options& options,
                                            std::vector<std::string> command);

// Where a rank's console lines go instead of the caller's fds 1 and 2: `stream` is 1 or
// 2, `line` is one whole line with its "[rank N] " prefix and newline. Called from the
// call's monitor thread, one line at a time.
using ConsoleSink = std::function<void(int stream, std::string_view line)>;

// A call whose ranks are a program that speaks the record protocol, as the Python worker
// (python -m sgpu._worker) does: each rank reads `payload` from the staged call.bin
// (SGPU_CALL_FILE, a kWorkerCall record) and writes rank-<N>/result.bin or error.json
// (and exception.bin) as a function's rank does; success is every rank exiting 0 with its
// result written, and wait() returns the result records' payloads.
struct WorkerCall {
  std::vector<std::string> command;  // command[0]: the program's path
  std::string payload;               // checked against Options::max_payload_bytes
  std::string function_name;         // the function's qualified name, for the run and errors
  ConsoleSink console;               // unset: the caller's fds 1 and 2
  // Which of the caller's signals cancel the call while it runs (launcher/interrupt.h):
  // Python's SIGINT is left to it (KeyboardInterrupt, on which its handle cancels the call).
  CaughtSignals caught_signals = CaughtSignals::kInterruptAndTerminate;
  std::string parent_run_id;  // the call's run is nested under this one (tracking::CallRunRequest)
  std::string source_name;    // the run's mlflow.source.name; empty: this process's executable
  // The worker's fork server (its path, then its whole argv: launcher/fork_server.h), used unless
  // the start method is exec; empty: every rank is exec'd.
  std::vector<std::string> fork_server;
  // Modules the fork server imports before it forks the ranks (kForkServerImportsVar).
  std::vector<std::string> server_imports;
};
std::shared_ptr<detail::Call> start_worker_call(const Options& options, WorkerCall call);

// Where calls' run folders go: Options::runs_dir (SGPU_RUNS_DIR stands in for it:
// contract::with_environment), else $TMPDIR/sgpu-<uid>/runs.
std::filesystem::path runs_dir(const Options& options);

}  // namespace sgpu::launcher
