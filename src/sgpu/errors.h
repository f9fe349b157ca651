// The errors sgpu raises. Every one derives from sgpu::Error.
//
// Inside the pipeline errors travel as values (a rank's failure is a record in its run
// folder); they are raised once, here, at the API:
//   ConfigError               bad options; nothing was started
//   AcceleratorMismatchError  the node cannot serve the request; nothing was started
//   TrackingError             a metric, param or tag MLflow would refuse, or a tracking
//                             store that cannot be used; raised at the logging call
//   DistributedError          a rank failed; carries one RankFailure row per rank
//     TimeoutError            the deadline passed; names the ranks still running
//     HangError               a collective was in flight longer than hang_timeout; says why
//     CancelledError          the caller cancelled the call, or was interrupted
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sgpu {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public Error {
 public:
  using Error::Error;
};

class AcceleratorMismatchError : public Error {
 public:
  using Error::Error;
};

class TrackingError : public Error {
 public:
  using Error::Error;
};

// What happened to one rank of a call that did not succeed.
struct RankFailure {
  enum class Kind {
    kOk,          // finished and returned a value
    kException,   // the function threw; exception_type and message say what
    kExitCode,    // the process exited with a non-zero code
    kSignal,      // the process was killed by a signal it did not get from sgpu
    kBadResult,   // exited 0, but its result record is missing, too large or corrupt
    kTimedOut,    // still running at the deadline
    kTerminated,  // torn down by sgpu after another rank failed, a timeout or a cancel
  };
  int rank = -1;
  int local_rank = -1;
  int node_rank = 0;  // the node it ran on, in a launch over several nodes
  std::string host;   // that node's host name, in a launch over several nodes
  pid_t pid = 0;
  Kind kind = Kind::kOk;
  std::optional<int> exit_code;
  std::optional<int> signal;
  std::string exception_type;
  std::string message;
  std::string stderr_tail;                     // the last lines the rank wrote to stderr
  std::chrono::system_clock::time_point time;  // when the failure happened (or was seen)
  bool root_cause = false;
  // In a folded world, the ranks it stood for ("standing for local rank 3 of every one of
  // 64 simulated nodes"); "" otherwise.
  std::string role;

  // "exit code 3", "signal 11 (SIGSEGV)", "threw std::runtime_error: boom", ...
  std::string describe() const;
};

std::string to_string(RankFailure::Kind kind);

// "SIGSEGV" for 11; "signal 77" for a signal without a name.
std::string signal_name(int signal);

// What the ranks' collective recorders say of a call that hung, timed out or failed in a
// collective (docs/errors.md, "When a call hangs").
struct CollectiveDiagnosis {
  std::string verdict;           // who the call waits on and why; empty when the rings say nothing
  std::vector<int> culprits;     // the ranks the verdict names as the cause
  std::string table;             // each rank's last collectives with their state
  std::string culprit_stack;     // the first culprit's stack, when taken
  std::filesystem::path stacks;  // every live rank's stacks (a file in the run folder), or empty
};

class DistributedError : public Error {
 public:
  DistributedError(std::string summary, std::vector<RankFailure> ranks,
                   std::filesystem::path run_dir, CollectiveDiagnosis collectives = {});
  // One row per rank, in rank order.
  const std::vector<RankFailure>& ranks() const { return ranks_; }
  // The earliest failure; nullptr for a timeout or cancel with no failed rank.
  const RankFailure* root_cause() const;
  const std::filesystem::path& run_dir() const { return run_dir_; }
  const CollectiveDiagnosis& collectives() const { return collectives_; }

 private:
  std::vector<RankFailure> ranks_;
  std::filesystem::path run_dir_;
  CollectiveDiagnosis collectives_;
};

class TimeoutError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

class HangError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

class CancelledError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

}  // namespace sgpu
