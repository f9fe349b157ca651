#include "sgpu/errors.h"

#include <string.h>

namespace sgpu {

std::string to_string(RankFailure::Kind kind) {
  switch (kind) {
    case RankFailure::Kind::kOk:
      return "ok";
    case RankFailure::Kind::kException:
      return "exception";
    case RankFailure::Kind::kExitCode:
      return "exit code";
    case RankFailure::Kind::kSignal:
      return "signal";
    case RankFailure::Kind::kBadResult:
      return "bad result";
    case RankFailure::Kind::kTimedOut:
      return "timed out";
    case RankFailure::Kind::kTerminated:
      return "terminated";
  }
  return "unknown";
}

std::string signal_name(int signal) {
  if (const char* abbrev = ::sigabbrev_np(signal)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(signal);
}

namespace {
// "signal 11 (SIGSEGV)", or "signal 77" for one without a name.
std::string signal_text(int signal) {
  const std::string name = signal_name(signal);
  return name.rfind("SIG", 0) == 0 ? "signal " + std::to_string(signal) + " (" + name + ")" : name;
}
}  // namespace

std::string RankFailure::describe() const {
  switch (kind) {
    case Kind::kOk:
      return "finished";
    case Kind::kException:
      return "threw " + exception_type + ": " + message;
    case Kind::kExitCode:
      return "exited with code " + std::to_string(exit_code.value_or(-1));
    case Kind::kSignal:
      return "killed by " + signal_text(signal.value_or(0));
    case Kind::kBadResult:
      return "returned an unusable result: " + message;
    case Kind::kTimedOut:
      return "still running at the deadline";
    case Kind::kTerminated:
      return "terminated by sgpu" +
             (signal      ? " (" + signal_text(*signal) + ")"
              : exit_code ? " (then exited with code " + std::to_string(*exit_code) + ")"
                          : std::string());
  }
  return "unknown";
}

DistributedError::DistributedError(std::string summary, std::vector<RankFailure> ranks,
                                   std::filesystem::path run_dir, CollectiveDiagnosis collectives)
    : Error(std::move(summary)),
      ranks_(std::move(ranks)),
      run_dir_(std::move(run_dir)),
      collectives_(std::move(collectives)) {}

const RankFailure* DistributedError::root_cause() const {
  for (const RankFailure& row : ranks_) {
    if (row.root_cause) return &row;
  }
  return nullptr;
}

}  // namespace sgpu
