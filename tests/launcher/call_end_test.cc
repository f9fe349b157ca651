// The table of a call's endings (launcher/call_end.h): each way a call ends gives its
// error class and headline, carries what the rings say where it should, and marks the
// root cause, with no process involved.
#include "launcher/call_end.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using sgpu::RankFailure;
using sgpu::launcher::CallEnd;
using sgpu::launcher::error_of;
using sgpu::launcher::Outcome;

RankFailure row(int rank, RankFailure::Kind kind) {
  RankFailure r;
  r.rank = rank;
  r.local_rank = rank;
  r.pid = 100 + rank;
  r.kind = kind;
  if (kind == RankFailure::Kind::kExitCode) r.exit_code = 3;
  return r;
}

CallEnd ending(Outcome outcome) {
  CallEnd end;
  end.outcome = outcome;
  end.label = "train";
  end.world_size = 3;
  end.rows = {row(0, RankFailure::Kind::kTerminated), row(1, RankFailure::Kind::kExitCode),
              row(2, RankFailure::Kind::kTerminated)};
  end.run_dir = "/runs/x";
  end.timeout = std::chrono::milliseconds(2000);
  end.hang_timeout = std::chrono::milliseconds(1500);
  end.collectives.verdict = "rank 1 never entered collective #3 (all_reduce).";
  end.collectives.culprits = {1};
  end.collectives.table = "each rank's last collectives, newest last:";
  return end;
}

// The error error_of() gives, thrown and caught as what it is.
template <class E>
E caught(const CallEnd& end) {
  const std::exception_ptr error = error_of(end);
  if (!error) throw std::logic_error("no error");
  try {
    std::rethrow_exception(error);
  } catch (const E& e) {
    return e;
  }
}

bool is_subclass(const sgpu::DistributedError& e) {
  return dynamic_cast<const sgpu::TimeoutError*>(&e) || dynamic_cast<const sgpu::HangError*>(&e) ||
         dynamic_cast<const sgpu::CancelledError*>(&e);
}

std::string text(const sgpu::DistributedError& e) { return e.what(); }

TEST(CallEnd, ASuccessIsNoErrorUnlessAPlannedFaultNeverActed) {
  CallEnd end = ending(Outcome::kSucceeded);
  EXPECT_EQ(error_of(end), nullptr);
  end.unacted = {"rank=1:exit=3@collective=9: rank 1 ran fewer than 9 collectives"};
  const auto e = caught<sgpu::DistributedError>(end);
  EXPECT_FALSE(is_subclass(e));
  EXPECT_NE(text(e).find("every rank of train finished, but the fault plan did not act:\n  "
                         "rank=1:exit=3@collective=9"),
            std::string::npos)
      << text(e);
  EXPECT_EQ(e.root_cause(), nullptr);  // no rank failed
}

TEST(CallEnd, ARankFailureNamesHowManyFailedAndCarriesTheRingsWhenTheyNameACulprit) {
  const auto e = caught<sgpu::DistributedError>(ending(Outcome::kRankFailed));
  EXPECT_FALSE(is_subclass(e));
  EXPECT_EQ(text(e).rfind("sgpu: 1 of 3 ranks of train failed\nrank 1 never entered", 0), 0u)
      << text(e);
  ASSERT_NE(e.root_cause(), nullptr);
  EXPECT_EQ(e.root_cause()->rank, 1);
  EXPECT_EQ(e.collectives().culprits, std::vector<int>{1});

  CallEnd no_culprit = ending(Outcome::kRankFailed);
  no_culprit.collectives.culprits.clear();
  no_culprit.nnodes = 2;
  const auto plain = caught<sgpu::DistributedError>(no_culprit);
  EXPECT_TRUE(plain.collectives().verdict.empty());
  EXPECT_EQ(text(plain).find("never entered"), std::string::npos) << text(plain);
  EXPECT_NE(text(plain).find("1 of 3 ranks of train failed (2 nodes)"), std::string::npos);
}

TEST(CallEnd, ATimeoutNamesTheRanksStillRunningAndCarriesTheRings) {
  CallEnd end = ending(Outcome::kTimedOut);
  end.rows = {row(0, RankFailure::Kind::kTimedOut), row(1, RankFailure::Kind::kOk),
              row(2, RankFailure::Kind::kTimedOut)};
  end.collectives.culprits.clear();
  const auto e = caught<sgpu::TimeoutError>(end);
  EXPECT_NE(text(e).find("sgpu: train timed out after 2000 ms; ranks still running: 0, 2."),
            std::string::npos)
      << text(e);
  EXPECT_NE(text(e).find("never entered collective #3"), std::string::npos);
  EXPECT_EQ(e.collectives().verdict, end.collectives.verdict);
}

TEST(CallEnd, AHangGivesTheVerdictAndTheHangTimeout) {
  const auto e = caught<sgpu::HangError>(ending(Outcome::kHung));
  EXPECT_EQ(text(e).rfind("sgpu: train hung: rank 1 never entered collective #3", 0), 0u)
      << text(e);
  EXPECT_NE(text(e).find("is 1.5 s: a collective was in flight that long"), std::string::npos)
      << text(e);
  EXPECT_EQ(e.collectives().culprits, std::vector<int>{1});
}

TEST(CallEnd, ACancelAnotherNodesFailureAndAFailedStartSayWhy) {
  CallEnd cancel = ending(Outcome::kCancelled);
  cancel.reason = "interrupted by SIGINT";
  const auto c = caught<sgpu::CancelledError>(cancel);
  EXPECT_EQ(text(c).rfind("sgpu: train interrupted by SIGINT", 0), 0u) << text(c);
  EXPECT_TRUE(c.collectives().verdict.empty());

  CallEnd peer = ending(Outcome::kPeerFailed);
  peer.reason = "node 1 (b) went away";
  const auto p = caught<sgpu::DistributedError>(peer);
  EXPECT_FALSE(is_subclass(p));
  EXPECT_EQ(text(p).rfind("sgpu: train failed on another node of the launch: node 1 (b)", 0), 0u);

  CallEnd start = ending(Outcome::kStartFailed);
  start.reason = "fork: out of memory";
  const auto s = caught<sgpu::DistributedError>(start);
  EXPECT_FALSE(is_subclass(s));
  EXPECT_EQ(text(s).rfind("sgpu: cannot start the ranks of train: fork: out of memory", 0), 0u);
}

TEST(CallEnd, TheTextComesFromTheHookWhenOneIsGiven) {
  CallEnd end = ending(Outcome::kCancelled);
  end.reason = "cancelled";
  end.text = [](const std::string& headline, const std::vector<RankFailure>& rows) {
    return "[" + headline + "] " + std::to_string(rows.size()) + " rows";
  };
  EXPECT_EQ(text(caught<sgpu::CancelledError>(end)), "[sgpu: train cancelled] 3 rows");
}

}  // namespace
