// Which rank is named the root cause.
#include "launcher/failure_table.h"

#include <gtest/gtest.h>

namespace sgpu::launcher {
namespace {

RankFailure row(int rank, RankFailure::Kind kind, int ms, std::string type = "") {
  RankFailure r;
  r.rank = rank;
  r.kind = kind;
  r.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(ms));
  r.exception_type = std::move(type);
  return r;
}

TEST(RootCause, TheEarliestOwnFailure) {
  std::vector<RankFailure> rows = {row(0, RankFailure::Kind::kTerminated, 1),
                                   row(1, RankFailure::Kind::kExitCode, 30),
                                   row(2, RankFailure::Kind::kException, 20, "std::runtime_error")};
  EXPECT_EQ(mark_root_cause(rows), 2);
  EXPECT_TRUE(rows[2].root_cause);
  EXPECT_FALSE(rows[1].root_cause);
}

TEST(RootCause, APeersCollectiveErrorDoesNotHideTheCrashThatCausedIt) {
  // The crash is seen after the survivors' "Connection closed by peer" records.
  std::vector<RankFailure> rows = {
      row(0, RankFailure::Kind::kException, 10, "gloo::IoException"),
      row(1, RankFailure::Kind::kSignal, 15),
      row(2, RankFailure::Kind::kException, 11, "c10::DistBackendError")};
  EXPECT_EQ(mark_root_cause(rows), 1);
}

TEST(RootCause, CollectiveErrorsAloneStillNameOne) {
  std::vector<RankFailure> rows = {row(0, RankFailure::Kind::kException, 12, "gloo::IoException"),
                                   row(1, RankFailure::Kind::kException, 10, "gloo::IoException")};
  EXPECT_EQ(mark_root_cause(rows), 1);
}

TEST(RootCause, NoneWhenNobodyFailedOnItsOwn) {
  std::vector<RankFailure> rows = {row(0, RankFailure::Kind::kTimedOut, 1),
                                   row(1, RankFailure::Kind::kTerminated, 2)};
  EXPECT_EQ(mark_root_cause(rows), -1);
}

}  // namespace
}  // namespace sgpu::launcher
