// What a call's front end gives it besides its options: where the ranks' console lines go,
// which of the caller's signals cancel it, and for a worker call (the Python package's), the
// program its ranks run and what they read.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/interrupt.h"

namespace sgpu::launcher {

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

}  // namespace sgpu::launcher
