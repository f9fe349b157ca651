#include "launcher/call_end.h"

#include <algorithm>

#include "contract/front_end.h"
#include "launcher/failure_table.h"
#include "launcher/hang_diagnosis.h"

namespace sgpu::launcher {
namespace {

// What the rings say, after the headline.
std::string with_rings(const CallEnd& end, const std::string& headline) {
  return headline + "\n" + end.collectives.verdict + "\n" + end.collectives.table + end.stacks;
}

std::string rank_failed(const CallEnd& end) {
  const int failed = static_cast<int>(std::count_if(end.rows.begin(), end.rows.end(), [](auto& r) {
    return r.kind != RankFailure::Kind::kOk && r.kind != RankFailure::Kind::kTerminated &&
           r.kind != RankFailure::Kind::kTimedOut;
  }));
  // A failure in or around a collective: what the rings say comes after the root cause.
  const std::string headline = failed_headline(end, std::max(failed, 1));
  return end.collectives.verdict.empty() ? headline : with_rings(end, headline);
}

std::string timed_out(const CallEnd& end) {
  const contract::Spelling spell(end.front_end);
  std::string running;
  for (const RankFailure& row : end.rows) {
    if (row.kind != RankFailure::Kind::kTimedOut) continue;
    running += (running.empty() ? "" : ", ") + std::to_string(row.rank);
  }
  const std::string headline =
      "sgpu: " + end.label + " timed out after " +
      std::to_string(end.timeout.value_or(std::chrono::milliseconds(0)).count()) +
      " ms; ranks still running: " + running + ". Raise " + spell("timeout") + ", or pass " +
      spell.no_timeout();
  return end.collectives.verdict.empty() ? headline : with_rings(end, headline);
}

std::string cancelled(const CallEnd& end) { return "sgpu: " + end.label + " " + end.reason; }

std::string peer_failed(const CallEnd& end) {
  return "sgpu: " + end.label + " failed on another node of the launch: " + end.reason;
}

std::string start_failed(const CallEnd& end) {
  return "sgpu: cannot start the ranks of " + end.label + ": " + end.reason;
}

std::string unacted(const CallEnd& end) {
  std::string list;
  for (const std::string& fault : end.unacted) list += "\n  " + fault;
  return "sgpu: every rank of " + end.label + " finished, but the fault plan did not act:" + list +
         "\nsuch a fault ends its rank; fix the plan or the point it names";
}

enum class ErrorClass { kDistributed, kTimeout, kHang, kCancelled };

struct Ending {
  Outcome outcome;
  std::string (*headline)(const CallEnd&);
  ErrorClass error;
};

// The table. An outcome not in it (a rank failed) is the first row's.
constexpr Ending kEndings[] = {
    {Outcome::kRankFailed, rank_failed, ErrorClass::kDistributed},
    {Outcome::kTimedOut, timed_out, ErrorClass::kTimeout},
    {Outcome::kHung, hung_headline, ErrorClass::kHang},
    {Outcome::kCancelled, cancelled, ErrorClass::kCancelled},
    {Outcome::kPeerFailed, peer_failed, ErrorClass::kDistributed},
    {Outcome::kStartFailed, start_failed, ErrorClass::kDistributed},
    {Outcome::kSucceeded, unacted, ErrorClass::kDistributed},
};

template <class E>
std::exception_ptr make(std::string text, CallEnd& end) {
  return std::make_exception_ptr(
      E(std::move(text), std::move(end.rows), end.run_dir, std::move(end.collectives)));
}

}  // namespace

std::string hung_headline(const CallEnd& end) {
  const contract::Spelling spell(end.front_end);
  const auto limit = end.hang_timeout.value_or(std::chrono::milliseconds(0));
  return "sgpu: " + end.label + " hung: " + end.collectives.verdict + "\n" + end.collectives.table +
         end.stacks + "\n(" + spell("hang_timeout") + " is " +
         describe_duration(std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count()) +
         ": a collective was in flight that long; raise it for steps that wait longer, or pass " +
         spell.none("hang_timeout") + ")";
}

std::string failed_headline(const CallEnd& end, int failed) {
  return "sgpu: " + std::to_string(failed) + " of " + std::to_string(end.world_size) +
         " ranks of " + end.label + " failed" +
         (end.nnodes > 1 ? " (" + std::to_string(end.nnodes) + " nodes)" : "");
}

std::exception_ptr error_of(CallEnd end) {
  if (end.outcome == Outcome::kSucceeded && end.unacted.empty()) return nullptr;
  const Ending* ending = &kEndings[0];
  for (const Ending& row : kEndings) {
    if (row.outcome == end.outcome) ending = &row;
  }
  if (end.outcome != Outcome::kSucceeded) mark_root_cause(end.rows);
  // A rank's failure carries what the rings say only when they name a culprit; a timeout
  // and a hang carry them always.
  const bool rings = ending->error == ErrorClass::kTimeout || ending->error == ErrorClass::kHang ||
                     (ending->outcome == Outcome::kRankFailed && !end.collectives.verdict.empty() &&
                      !end.collectives.culprits.empty());
  if (!rings) end.collectives = {};
  const std::string headline = ending->headline(end);
  std::string text =
      end.text ? end.text(headline, end.rows) : format_failure(headline, end.rows, end.run_dir);
  switch (ending->error) {
    case ErrorClass::kTimeout:
      return make<TimeoutError>(std::move(text), end);
    case ErrorClass::kHang:
      return make<HangError>(std::move(text), end);
    case ErrorClass::kCancelled:
      return make<CancelledError>(std::move(text), end);
    case ErrorClass::kDistributed:
      break;
  }
  return make<DistributedError>(std::move(text), end);
}

}  // namespace sgpu::launcher
