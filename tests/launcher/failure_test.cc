// Every failure kind at any rank: the error names that rank and kind, teardown is bounded,
// and no process of the call is left (checked in the process table).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "sgpu/sgpu.h"
#include "testing/process_table.h"
#include "testing/sim_options.h"

namespace {

enum Fault { kThrow = 0, kExit, kAbort, kSegv, kHang, kFaultCount };

int faulty(int bad_rank, int fault) {
  // Every rank leaves a grandchild behind, which teardown must reach too.
  if (std::system("sleep 300 &") != 0) return -1;
  if (sgpu::global_rank() != bad_rank || fault == kHang) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return sgpu::global_rank();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::cerr << "rank " << sgpu::global_rank() << " about to fail" << std::endl;
  switch (fault) {
    case kThrow:
      throw std::runtime_error("boom at rank " + std::to_string(bad_rank));
    case kExit:
      std::exit(3);
    case kAbort:
      std::abort();
    case kSegv:
      ::raise(SIGSEGV);
      break;
  }
  return -1;
}

std::string unique_marker() {
  static int n = 0;
  return "failure-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Runs `faulty` with the marker in the ranks' environment; returns the error.
// The timeout is the hang's; a fault must not race it while a loaded machine starts ranks.
template <class E>
E run_faulty(int gpus, int bad_rank, int fault, std::chrono::milliseconds* took,
             const std::string& marker) {
  sgpu::Options options = sgpu::testing::sim(gpus, true);
  options.timeout = std::chrono::milliseconds(fault == kHang ? 1500 : 60000);
  ::setenv("SGPU_TEST_MARKER", marker.c_str(), 1);
  const auto start = std::chrono::steady_clock::now();
  try {
    sgpu::distributed(faulty, options).distributed(bad_rank, fault);
  } catch (const E& e) {
    *took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  start);
    ::unsetenv("SGPU_TEST_MARKER");
    return e;
  }
  ::unsetenv("SGPU_TEST_MARKER");
  throw std::logic_error("the call did not fail");
}

// No process of the call is left: not its ranks, nor what they started (by process
// group, which sees fork-server ranks too), nor anything with its marker (exec).
void expect_nothing_left(const std::string& marker, const sgpu::DistributedError& error) {
  EXPECT_TRUE(sgpu::testing::eventually(
      [&] { return sgpu::testing::alive_in_groups(sgpu::testing::rank_pids(error)).empty(); },
      std::chrono::seconds(2)))
      << "ranks of the call, or what they started, are left";
  EXPECT_TRUE(sgpu::testing::eventually(
      [&] { return sgpu::testing::processes_with("SGPU_TEST_MARKER=" + marker).empty(); },
      std::chrono::seconds(2)))
      << "processes of the call are left";
  EXPECT_TRUE(sgpu::testing::children().empty()) << "unreaped children";
}

RC_GTEST_PROP(Failure, AnyFaultAtAnyRankIsReportedForThatRank, ()) {
  const int gpus = *rc::gen::inRange(1, 5);
  const int bad_rank = *rc::gen::inRange(0, gpus);
  const int fault = *rc::gen::inRange(0, static_cast<int>(kHang));
  const std::string marker = unique_marker();
  std::chrono::milliseconds took{};
  const auto error = run_faulty<sgpu::DistributedError>(gpus, bad_rank, fault, &took, marker);
  const std::string what = error.what();
  const sgpu::RankFailure* root = error.root_cause();
  if (root == nullptr) RC_FAIL("no root cause in: " + what);
  RC_ASSERT(root->rank == bad_rank);
  RC_ASSERT(error.ranks().size() == static_cast<std::size_t>(gpus));
  RC_ASSERT(what.find("root cause: rank " + std::to_string(bad_rank)) != std::string::npos);
  switch (fault) {
    case kThrow:
      RC_ASSERT(root->kind == sgpu::RankFailure::Kind::kException);
      RC_ASSERT(root->exception_type == "std::runtime_error");
      RC_ASSERT(root->message == "boom at rank " + std::to_string(bad_rank));
      break;
    case kExit:
      RC_ASSERT(root->kind == sgpu::RankFailure::Kind::kExitCode);
      RC_ASSERT(root->exit_code == 3);
      break;
    case kAbort:
      RC_ASSERT(root->kind == sgpu::RankFailure::Kind::kSignal);
      RC_ASSERT(root->signal == SIGABRT);
      RC_ASSERT(what.find("SIGABRT") != std::string::npos);
      break;
    case kSegv:
      RC_ASSERT(root->kind == sgpu::RankFailure::Kind::kSignal);
      RC_ASSERT(root->signal == SIGSEGV);
      RC_ASSERT(root->stderr_tail.find("backtrace") != std::string::npos);
      break;
  }
  if (root->stderr_tail.find("about to fail") == std::string::npos) {
    RC_FAIL("the rank's stderr tail lacks what it wrote: " + root->stderr_tail);
  }
  for (const sgpu::RankFailure& row : error.ranks()) {
    if (row.rank != bad_rank) RC_ASSERT(row.kind == sgpu::RankFailure::Kind::kTerminated);
  }
  // Sleeping ranks die at the first SIGTERM; the grace period is never needed.
  RC_ASSERT(took < std::chrono::seconds(5));
  RC_ASSERT(sgpu::testing::eventually(
      [&] { return sgpu::testing::alive_in_groups(sgpu::testing::rank_pids(error)).empty(); },
      std::chrono::seconds(2)));
  RC_ASSERT(sgpu::testing::eventually(
      [&] { return sgpu::testing::processes_with("SGPU_TEST_MARKER=" + marker).empty(); },
      std::chrono::seconds(2)));
  RC_ASSERT(sgpu::testing::children().empty());
}

TEST(Failure, HangPastTheTimeoutNamesTheRanksStillRunning) {
  const std::string marker = unique_marker();
  std::chrono::milliseconds took{};
  const auto error = run_faulty<sgpu::TimeoutError>(3, 1, kHang, &took, marker);
  const std::string what = error.what();
  EXPECT_NE(what.find("timed out after 1500 ms; ranks still running: 0, 1, 2"), std::string::npos)
      << what;
  for (const auto& row : error.ranks()) EXPECT_EQ(row.kind, sgpu::RankFailure::Kind::kTimedOut);
  EXPECT_GE(took, std::chrono::milliseconds(1500));
  EXPECT_LT(took, std::chrono::milliseconds(5000));
  expect_nothing_left(marker, error);
}

void ignore_sigterm_and_hang(int) {
  ::signal(SIGTERM, SIG_IGN);
  std::this_thread::sleep_for(std::chrono::seconds(120));
}

TEST(Failure, ARankIgnoringSigtermIsKilledAfterTheGrace) {
  sgpu::Options options = sgpu::testing::sim(2);
  // Long enough for exec'd ranks on a loaded machine to ignore SIGTERM before it comes.
  options.timeout = std::chrono::milliseconds(2500);
  options.teardown_grace = std::chrono::milliseconds(700);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(sgpu::distributed(ignore_sigterm_and_hang, options).distributed(0),
               sgpu::TimeoutError);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(3200));
  EXPECT_LT(took, std::chrono::milliseconds(7000));
  EXPECT_TRUE(sgpu::testing::children().empty());
}

int throw_non_standard(int) { throw 42; }

TEST(Failure, NonStandardExceptionsAreNamedByType) {
  sgpu::Options options = sgpu::testing::sim(1);
  try {
    sgpu::distributed(throw_non_standard, options).distributed(0);
    FAIL();
  } catch (const sgpu::DistributedError& e) {
    ASSERT_NE(e.root_cause(), nullptr);
    EXPECT_EQ(e.root_cause()->exception_type, "int");
    EXPECT_TRUE(std::filesystem::exists(e.run_dir() / "rank-0" / "error.json"));
    std::filesystem::remove_all(e.run_dir());
  }
}

}  // namespace
