// The seam between the typed public API (sgpu/distributed.h) and the launcher.
//
// The templates turn a function and its arguments into a serialize::CallRecord; the
// launcher (src/launcher/) runs it on every rank and hands back each rank's result bytes.
// Nothing here is for users to call directly.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sgpu/comm.h"
#include "sgpu/compute.h"
#include "sgpu/internal/call_record.h"
#include "sgpu/memory.h"
#include "sgpu/options.h"

namespace sgpu::detail {

// The typed trampoline's type: detail::entry<R, A...> (sgpu/distributed.h) for the
// function at the first argument, the mangled signature it must have and the argument
// bytes; returns the result's bytes. The rank resolves it from CallRecord::entry.
using EntryFn = std::string (*)(void*, std::string_view, std::string_view);

// One call in flight. Thread-safe.
class Call {
 public:
  virtual ~Call() = default;
  // Blocks until every rank finished; returns each rank's result bytes in rank order, or
  // throws DistributedError (TimeoutError, CancelledError). Later calls return or throw
  // the same again.
  virtual const std::vector<std::string>& wait() = 0;
  // wait(), then each rank's result bytes moved out to the caller, so that a caller that
  // decodes them one by one (Python) never holds them twice; wait() returns them empty
  // from then on.
  virtual std::vector<std::string> take_results() = 0;
  // True when the call finished within `limit` (wait() then returns at once).
  virtual bool wait_for(std::chrono::milliseconds limit) = 0;
  // Tears the ranks down; wait() then throws CancelledError. No-op once finished.
  virtual void cancel() = 0;
  virtual const std::filesystem::path& run_dir() const = 0;
  virtual const std::string& gpu_type() const = 0;  // requested or detected
  // Where the call's MLflow run is shown (web link or folder); empty when untracked.
  virtual const std::string& tracking_link() const = 0;
  // Blocks until every rank finished; each rank's device memory figures at its end, in
  // rank order (empty for a rank that left none), whether the call succeeded or failed.
  virtual const std::vector<MemoryStats>& memory_stats() = 0;
  // The same for each rank's collectives (sgpu/comm.h); empty for a rank that recorded
  // none (Options::recorder_entries = 0 records none).
  virtual const std::vector<CommStats>& comm_stats() = 0;
  // The same for each rank's compute estimate (sgpu/compute.h); empty for a rank that
  // timed nothing (it computed values).
  virtual const std::vector<ComputeStats>& compute_stats() = 0;
  // The caller decoded every result: the run folder is removed unless kept.
  virtual void results_taken() = 0;
  // Raises the DistributedError for a result that did not decode on the caller's side
  // (the run folder is kept).
  [[noreturn]] virtual void raise_bad_result(int rank, const std::string& why) = 0;
};

// Checks the options and the node, stages the call and starts its ranks. Throws
// ConfigError or AcceleratorMismatchError before anything is started.
std::shared_ptr<Call> start_call(const Options& options, serialize::CallRecord record);

// Runs `command` (a program and its arguments, found on PATH) as every rank, with the
// same environment, checks, streaming, teardown and failure table as a function's call;
// success is every rank exiting 0 (wait() then returns one empty string per rank).
std::shared_ptr<Call> start_program(const Options& options, std::vector<std::string> command);

// Where a piece of code lives, in a form another process of the same binary can resolve.
serialize::CodeAddress locate_code(const void* address);
// A readable name for the function at `address` ("" when the binary keeps none).
std::string code_name(const void* address);

}  // namespace sgpu::detail
