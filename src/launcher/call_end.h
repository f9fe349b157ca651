// How a call ended, and the error that its caller gets for it: one row of a table per way
// a call ends (a rank failed, a timeout, a hang, a cancel, another node's failure, a start
// that failed, a fault plan that never acted), each with its error class and headline.
// The monitor decides the ending; this turns it into the error, apart from any process.
#pragma once

#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sgpu/errors.h"
#include "sgpu/options.h"

namespace sgpu::launcher {

enum class Outcome {
  kRunning,
  kSucceeded,
  kRankFailed,
  kTimedOut,
  kHung,
  kCancelled,
  kStartFailed,
  kPeerFailed  // another node of the launch failed or went away
};

struct CallEnd {
  Outcome outcome = Outcome::kSucceeded;
  std::string label;  // the function's name, or the program's
  int world_size = 1;
  int nnodes = 1;
  std::vector<RankFailure> rows;  // every rank's, in rank order
  std::filesystem::path run_dir;
  CollectiveDiagnosis collectives;  // what the rings said when the call went wrong
  std::string stacks;               // the culprit's stack and where the others' are
  std::optional<std::chrono::milliseconds> timeout;       // the call's
  std::optional<std::chrono::milliseconds> hang_timeout;  // the hang watchdog's
  std::string reason;  // a cancel's ("interrupted by SIGINT"), another node's, a start's
  std::vector<std::string> unacted;     // faults planned to end their rank that never acted
  FrontEnd front_end = FrontEnd::kCpp;  // how the advice names settings (Options::front_end)
  // The error's text from its headline and the rows (failure_table.h, over several nodes
  // what this node shows); empty: format_failure.
  std::function<std::string(const std::string& headline, const std::vector<RankFailure>& rows)>
      text;
};

// "sgpu: 2 of 8 ranks of train failed" (with " (2 nodes)" over several).
std::string failed_headline(const CallEnd& end, int failed);

// "sgpu: train hung: <verdict>", each rank's last collectives, the stacks, and the hang
// timeout that judged it: a hang's headline, for a launch's ranks and for a world of
// processes on a simulated node alike (launcher/node_watch.h).
std::string hung_headline(const CallEnd& end);

// The error the call ends in, its root cause marked in its rows; null for a success with
// every planned fault acted (whose results the caller then reads).
std::exception_ptr error_of(CallEnd end);

}  // namespace sgpu::launcher
