// The monitor loop (launcher/monitor.h) with a fake starter and no process: how each way
// of ending decides the verdict, who gets which signal and when, and that output is read
// to the end but no longer than the drain limit.
#include "launcher/monitor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "testing/temp_dir.h"

namespace {

using namespace std::chrono_literals;
using sgpu::launcher::Clock;
using sgpu::launcher::Deadlines;
using sgpu::launcher::ExitStatus;
using sgpu::launcher::InterruptScope;
using sgpu::launcher::Monitor;
using sgpu::launcher::MonitorHooks;
using sgpu::launcher::Outcome;
using sgpu::launcher::RankExit;
using sgpu::launcher::RankSlot;
using sgpu::launcher::RankStarter;
using sgpu::launcher::SpawnRequest;
using sgpu::launcher::TeardownPlan;
using sgpu::launcher::UniqueFd;
using sgpu::launcher::Verdict;

ExitStatus exited(int code) { return {code, std::nullopt}; }
ExitStatus killed(int signal) { return {std::nullopt, signal}; }

// Ranks are pids the test makes up. Each exits when the test says, or on a signal it
// heeds: every rank dies of SIGKILL, and of SIGTERM unless told to ignore it. What the
// monitor sent is kept, in order, with kill_tree as signal -SIGKILL.
class FakeStarter final : public RankStarter {
 public:
  FakeStarter() : wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  pid_t start(const SpawnRequest&) override { throw std::logic_error("the monitor starts none"); }

  void add_poll_fds(std::vector<pollfd>& fds) const override {
    fds.push_back({wake_.get(), POLLIN, 0});
  }

  std::vector<RankExit> collect_exits() override {
    std::uint64_t n = 0;
    [[maybe_unused]] ssize_t r = ::read(wake_.get(), &n, sizeof n);
    std::lock_guard lock(mutex_);
    return std::exchange(pending_, {});
  }

  void release() override {
    std::lock_guard lock(mutex_);
    released_after_ = sent_.size();
  }

  void signal(pid_t pid, int signal) override {
    {
      std::lock_guard lock(mutex_);
      sent_.emplace_back(pid, signal);
    }
    if (signal == SIGKILL || (signal == SIGTERM && !ignores_term_.count(pid))) {
      exit(pid, killed(signal));
    }
  }

  void kill_tree(pid_t pid) override {
    {
      std::lock_guard lock(mutex_);
      sent_.emplace_back(pid, -SIGKILL);
    }
    exit(pid, killed(SIGKILL));
  }

  // The rank ends now (once; later ends of a rank that ended are ignored).
  void exit(pid_t pid, ExitStatus status) {
    {
      std::lock_guard lock(mutex_);
      if (!ended_.insert(pid).second) return;
      pending_.push_back({pid, status});
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(wake_.get(), &one, sizeof one);
  }

  void ignore_sigterm(pid_t pid) { ignores_term_.insert(pid); }

  std::vector<int> signals_to(pid_t pid) const {
    std::lock_guard lock(mutex_);
    std::vector<int> signals;
    for (const auto& [to, signal] : sent_) {
      if (to == pid) signals.push_back(signal);
    }
    return signals;
  }
  // How many signals had been sent when release() came; -1: it never came.
  long released_after() const { return released_after_; }
  std::size_t sent() const { return sent_.size(); }

 private:
  UniqueFd wake_;
  mutable std::mutex mutex_;
  std::vector<RankExit> pending_;
  std::set<pid_t> ended_;
  std::set<pid_t> ignores_term_;
  std::vector<std::pair<pid_t, int>> sent_;
  long released_after_ = -1;
};

// A rank succeeds when it exits 0, unless the test marked it as having written no result.
class FakeCall final : public MonitorHooks {
 public:
  bool exited_ok(const RankSlot& slot) const override {
    return slot.exit->exit_code == 0 && !no_result.count(slot.pid);
  }
  void diagnose(Outcome why) override { diagnosed.push_back(why); }
  bool hung() override { return hang.load(); }
  std::optional<std::string> peer_failure() override {
    ++peer_polls;
    return peer;
  }
  void tell_peers(const Verdict& verdict) override { told.push_back(verdict.outcome); }

  std::set<pid_t> no_result;
  std::vector<Outcome> diagnosed;
  std::atomic<bool> hang{false};
  std::optional<std::string> peer;
  int peer_polls = 0;
  std::vector<Outcome> told;
};

std::vector<RankSlot> ranks(int n) {
  std::vector<RankSlot> slots(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    slots[static_cast<std::size_t>(i)].rank = i;
    slots[static_cast<std::size_t>(i)].pid = 100 + i;
  }
  return slots;
}

class MonitorTest : public ::testing::Test {
 protected:
  Verdict run(std::vector<RankSlot>& slots, const Deadlines& deadlines = {},
              TeardownPlan teardown = {5s, 1s}) {
    Monitor monitor(starter, slots, call, cancel.get(), interrupts);
    if (start_error) monitor.start_failed(*start_error);
    return monitor.run(deadlines, teardown);
  }

  FakeStarter starter;
  FakeCall call;
  UniqueFd cancel{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  InterruptScope interrupts{sgpu::launcher::CaughtSignals::kTerminateOnly};
  std::optional<std::string> start_error;
};

TEST_F(MonitorTest, RanksThatAllSucceedEndTheCallWithNoTeardownAndEveryGroupSweptBeforeReaping) {
  auto slots = ranks(3);
  for (const RankSlot& slot : slots) starter.exit(slot.pid, exited(0));
  const Verdict verdict = run(slots);
  EXPECT_EQ(verdict.outcome, Outcome::kSucceeded);
  EXPECT_FALSE(verdict.teardown_began.has_value());
  EXPECT_TRUE(call.diagnosed.empty());
  for (const RankSlot& slot : slots) {
    // No SIGTERM: the drain's SIGKILL to what the rank left, and the final sweep's.
    EXPECT_EQ(starter.signals_to(slot.pid), (std::vector<int>{SIGKILL, SIGKILL}));
    EXPECT_FALSE(slot.exited_in_teardown);
  }
  EXPECT_EQ(starter.released_after(), static_cast<long>(starter.sent()));
}

TEST_F(MonitorTest, TheFirstRankToFailOnItsOwnDecidesAndTheOthersAreTerminated) {
  auto slots = ranks(3);
  starter.exit(101, exited(3));
  const Verdict verdict = run(slots);
  EXPECT_EQ(verdict.outcome, Outcome::kRankFailed);
  ASSERT_TRUE(verdict.teardown_began.has_value());
  EXPECT_EQ(call.diagnosed, (std::vector<Outcome>{Outcome::kRankFailed}));
  EXPECT_FALSE(slots[1].exited_in_teardown);
  EXPECT_EQ(slots[1].exit->exit_code, 3);
  for (int i : {0, 2}) {
    EXPECT_TRUE(slots[static_cast<std::size_t>(i)].exited_in_teardown);
    EXPECT_EQ(slots[static_cast<std::size_t>(i)].exit->signal, SIGTERM);
    EXPECT_EQ(starter.signals_to(100 + i).front(), SIGTERM);
  }
  EXPECT_EQ(starter.signals_to(101), (std::vector<int>{SIGKILL, SIGKILL}));  // no SIGTERM
}

TEST_F(MonitorTest, ARankThatExitsZeroWithoutItsResultHasFailed) {
  auto slots = ranks(2);
  call.no_result.insert(100);
  starter.exit(100, exited(0));
  EXPECT_EQ(run(slots).outcome, Outcome::kRankFailed);
  EXPECT_TRUE(slots[1].exited_in_teardown);
}

TEST_F(MonitorTest, ARankThatIgnoresSigtermHasItsTreeKilledOnceTheGraceHasPassed) {
  auto slots = ranks(2);
  starter.ignore_sigterm(101);
  starter.exit(100, exited(1));
  const auto began = Clock::now();
  run(slots, {}, TeardownPlan{200ms, 1s});
  EXPECT_GE(Clock::now() - began, 200ms);
  EXPECT_EQ(starter.signals_to(101).at(0), SIGTERM);
  EXPECT_EQ(starter.signals_to(101).at(1), -SIGKILL);  // kill_tree, after the grace
  EXPECT_EQ(slots[1].exit->signal, SIGKILL);
}

TEST_F(MonitorTest, TheDeadlineTimesOutTheRanksStillRunningOnly) {
  auto slots = ranks(2);
  starter.exit(100, exited(0));  // done, waiting for its peer
  Deadlines deadlines;
  deadlines.call = Clock::now() + 50ms;
  const Verdict verdict = run(slots, deadlines);
  EXPECT_EQ(verdict.outcome, Outcome::kTimedOut);
  EXPECT_FALSE(slots[0].timed_out);
  EXPECT_TRUE(slots[1].timed_out);
  EXPECT_EQ(call.diagnosed, (std::vector<Outcome>{Outcome::kTimedOut}));
}

TEST_F(MonitorTest, ACancelEndsTheCallAsCancelledWithNothingToDiagnose) {
  auto slots = ranks(2);
  const std::uint64_t one = 1;
  ASSERT_EQ(::write(cancel.get(), &one, sizeof one), static_cast<ssize_t>(sizeof one));
  const Verdict verdict = run(slots);
  EXPECT_EQ(verdict.outcome, Outcome::kCancelled);
  EXPECT_EQ(verdict.reason, "cancelled");
  EXPECT_TRUE(call.diagnosed.empty());
  EXPECT_TRUE(slots[0].exited_in_teardown && slots[1].exited_in_teardown);
}

TEST_F(MonitorTest, TheWatchdogJudgesAHangOnlyWhenItLooks) {
  auto slots = ranks(2);
  call.hang = true;
  Deadlines deadlines;
  deadlines.watch_every = 20ms;
  const auto began = Clock::now();
  EXPECT_EQ(run(slots, deadlines).outcome, Outcome::kHung);
  EXPECT_GE(Clock::now() - began, 20ms);
  EXPECT_EQ(call.diagnosed, (std::vector<Outcome>{Outcome::kHung}));
}

TEST_F(MonitorTest, AnotherNodesFailureEndsThisNodesRanksAndIsNotToldBack) {
  auto slots = ranks(2);
  call.peer = "node 1 (b) rank 3 exited with code 1";
  Deadlines deadlines;
  deadlines.peers_every = 10ms;
  const Verdict verdict = run(slots, deadlines);
  EXPECT_EQ(verdict.outcome, Outcome::kPeerFailed);
  EXPECT_EQ(verdict.reason, *call.peer);
  EXPECT_TRUE(call.told.empty());
  EXPECT_TRUE(call.diagnosed.empty());
}

TEST_F(MonitorTest, AFailureHereIsToldToTheOtherNodesUntilTheRanksAreGone) {
  auto slots = ranks(2);
  starter.exit(100, exited(2));
  Deadlines deadlines;
  deadlines.peers_every = 10ms;
  EXPECT_EQ(run(slots, deadlines).outcome, Outcome::kRankFailed);
  ASSERT_FALSE(call.told.empty());
  EXPECT_EQ(call.told.front(), Outcome::kRankFailed);
}

TEST_F(MonitorTest, ASuccessHereTellsTheOtherNodesNothing) {
  auto slots = ranks(2);
  for (const RankSlot& slot : slots) starter.exit(slot.pid, exited(0));
  Deadlines deadlines;
  deadlines.peers_every = 10ms;
  EXPECT_EQ(run(slots, deadlines).outcome, Outcome::kSucceeded);
  EXPECT_TRUE(call.told.empty());
}

TEST_F(MonitorTest, AFailedStartTearsDownTheRanksThatDidStart) {
  auto slots = ranks(3);
  slots[2].pid = 0;  // never started
  start_error = "fork: Resource temporarily unavailable";
  const Verdict verdict = run(slots);
  EXPECT_EQ(verdict.outcome, Outcome::kStartFailed);
  EXPECT_EQ(verdict.reason, *start_error);
  EXPECT_TRUE(call.diagnosed.empty());
  EXPECT_EQ(starter.signals_to(100).front(), SIGTERM);
  EXPECT_EQ(starter.signals_to(101).front(), SIGTERM);
  EXPECT_TRUE(starter.signals_to(0).empty());
}

TEST_F(MonitorTest, OutputIsReadToItsEndButNoLongerThanTheDrainLimitOnceEveryRankExited) {
  const std::filesystem::path dir = sgpu::testing::make_temp_dir("monitor-test");
  auto slots = ranks(1);
  sgpu::launcher::Pipe out = sgpu::launcher::make_pipe();
  slots[0].out =
      std::make_unique<sgpu::launcher::LogStream>(std::move(out.read), 0, dir / "stdout.log", -1);
  const std::string said = "last words\n";
  ASSERT_EQ(::write(out.write.get(), said.data(), said.size()), static_cast<ssize_t>(said.size()));
  starter.exit(100, exited(0));  // what it started still holds the pipe open
  const auto began = Clock::now();
  EXPECT_EQ(run(slots, {}, TeardownPlan{5s, 150ms}).outcome, Outcome::kSucceeded);
  const auto took = Clock::now() - began;
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 5s);
  EXPECT_FALSE(slots[0].out->open());
  std::ifstream log(dir / "stdout.log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_EQ(text.str(), said);
  std::filesystem::remove_all(dir);
}

}  // namespace
