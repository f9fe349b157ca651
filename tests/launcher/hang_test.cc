// Calls that hang, on simulated ranks: a rank that hangs before a collective, one that
// skips one, one that gives another size. The caller's verdict names that rank and that
// collective, from the ranks' collective rings; a call whose collectives keep completing
// is never judged hung; a timeout carries the same verdict.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/test_backend.h"

namespace {

constexpr int kCount = 1024;

// Tensors on the rank's device (a GPU in the gpu-labelled instance).
at::Tensor ones(int count) { return at::ones({count}, at::Device(sgpu::device())); }

void all_reduce(at::Tensor& t) {
  std::vector<at::Tensor> v{t};
  sgpu::process_group().allreduce(v)->wait();
}

// `steps` all-reduces; a hang comes from the fault plan.
int all_reduces(int steps) {
  at::Tensor t = ones(kCount);
  for (int i = 0; i < steps; ++i) all_reduce(t);
  return sgpu::global_rank();
}

// All-reduce and broadcast by turns, six collectives; `skipper` leaves out its `skipped`-th.
int skips(int skipper, int skipped) {
  at::Tensor t = ones(kCount);
  for (int i = 1; i <= 6; ++i) {
    if (sgpu::global_rank() == skipper && i == skipped) continue;
    if (i % 2 == 1) {
      all_reduce(t);
    } else {
      std::vector<at::Tensor> v{t};
      sgpu::process_group().broadcast(v, c10d::BroadcastOptions{})->wait();
    }
  }
  return sgpu::global_rank();
}

// Four all-gathers of kCount floats; `odd` gives `odd_count` at its `at`-th.
int gathers(int odd, int at, int odd_count) {
  const int world = sgpu::world_size();
  for (int i = 1; i <= 4; ++i) {
    const int count = sgpu::global_rank() == odd && i == at ? odd_count : kCount;
    std::vector<at::Tensor> in{ones(count)};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < world; ++r) out[0].push_back(at::empty_like(in[0]));
    sgpu::process_group().allgather(out, in)->wait();
  }
  return sgpu::global_rank();
}

// Collectives that keep completing for about `millis`, one every 50 ms (counted, so that
// every rank makes as many).
int steady(int millis) {
  at::Tensor t = ones(kCount);
  for (int i = 0; i < millis / 50; ++i) {
    all_reduce(t);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return sgpu::global_rank();
}

// One all-reduce, then every rank sleeps outside any collective.
int sleeps_after_one(int millis) {
  at::Tensor t = ones(kCount);
  all_reduce(t);
  std::this_thread::sleep_for(std::chrono::milliseconds(millis));
  return sgpu::global_rank();
}

// At most 8 ranks, and what the test backend has.
int most_ranks() { return std::min(8, sgpu::testing::test_backend_ranks()); }

// The fault plan is the simulated backend's.
bool faults_planned() { return sgpu::testing::test_backend() == "sim"; }

sgpu::Options options(int gpus) {
  sgpu::Options o;
  o.gpus = gpus;
  o.backend = sgpu::testing::test_backend();
  o.timeout = std::chrono::seconds(60);
  o.hang_timeout = std::chrono::milliseconds(1500);
  o.console_ranks = std::vector<int>{};
  o.tracking = false;
  return o;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the call; returns the DistributedError it must end with.
template <class E = sgpu::DistributedError, class F, class... Args>
E failure_of(F* fn, const sgpu::Options& o, Args... args) {
  try {
    sgpu::distributed(fn, o).distributed(args...);
  } catch (const E& e) {
    return e;
  }
  throw std::logic_error("the call did not fail as expected");
}

TEST(Hang, AHangBeforeACollectiveNamesThatRankAndCollective) {
  if (!faults_planned()) GTEST_SKIP() << "the fault plan is the simulated backend's";
  EXPECT_TRUE(rc::check("a hang at rank r before collective k is named so", [] {
    const int gpus = *rc::gen::inRange(2, 9);
    const int rank = *rc::gen::inRange(0, gpus);
    const int k = *rc::gen::inRange(1, 5);
    sgpu::Options o = options(gpus);
    o.sim.faults = "rank=" + std::to_string(rank) + ":hang@collective=" + std::to_string(k);
    const auto e = failure_of<sgpu::HangError>(all_reduces, o, 5);
    RC_ASSERT(e.collectives().culprits == std::vector<int>{rank});
    const std::string verdict = "rank " + std::to_string(rank) + " never entered collective #" +
                                std::to_string(k) + " (all_reduce of 1024 float32 (sum))";
    RC_ASSERT(e.collectives().verdict.rfind(verdict, 0) == 0);
    RC_ASSERT(std::string(e.what()).find(" hung: " + verdict) != std::string::npos);
    if (k > 1) {
      RC_ASSERT(e.collectives().verdict.find("last collective there was #" +
                                             std::to_string(k - 1)) != std::string::npos);
    }
    const std::string report = read_file(e.run_dir() / "collectives.txt");
    RC_ASSERT(report.rfind(verdict, 0) == 0);
    // The culprit's main thread is where the fault holds it; every rank's stacks are kept.
    const std::string& stack = e.collectives().culprit_stack;
    RC_ASSERT(stack.rfind("rank " + std::to_string(rank) + " (pid ", 0) == 0);
    RC_ASSERT(stack.find("sgpu::sim::act(sgpu::sim::Fault const&)") != std::string::npos);
    RC_ASSERT(std::string(e.what()).find("the stack of rank " + std::to_string(rank)) !=
              std::string::npos);
    const std::string stacks = read_file(e.collectives().stacks);
    for (int r = 0; r < gpus; ++r) {
      RC_ASSERT(stacks.find("rank " + std::to_string(r) + " (pid ") != std::string::npos);
    }
    std::filesystem::remove_all(e.run_dir());
  }));
}

TEST(Hang, ARankThatSkipsACollectiveIsNamedAtIt) {
  if (most_ranks() < 2) GTEST_SKIP() << "needs 2 ranks";
  EXPECT_TRUE(rc::check("a rank that skips collective k is named at k", [] {
    const int gpus = *rc::gen::inRange(2, most_ranks() + 1);
    const int rank = *rc::gen::inRange(0, gpus);
    const int k = *rc::gen::inRange(1, 6);
    const auto e = failure_of(skips, options(gpus), rank, k);
    // Its k-th collective is the other op: the ranks disagree at #k (the shared-memory
    // transport fails them there; over Gloo they wait until the watchdog judges it).
    RC_ASSERT(e.collectives().culprits == std::vector<int>{rank} ||
              (gpus == 2 && e.collectives().culprits.size() == 1));
    RC_ASSERT(e.collectives().verdict.find("collective #" + std::to_string(k)) !=
              std::string::npos);
    std::filesystem::remove_all(e.run_dir());
  }));
}

TEST(Hang, ARankThatGivesAnotherSizeIsNamedWithBothSizes) {
  if (most_ranks() < 3) GTEST_SKIP() << "needs 3 ranks";
  EXPECT_TRUE(rc::check("a rank that gives another size is named with both sizes", [] {
    const int gpus = *rc::gen::inRange(3, most_ranks() + 1);  // with two, neither is "the others'"
    const int rank = *rc::gen::inRange(0, gpus);
    const int k = *rc::gen::inRange(1, 5);
    const auto e = failure_of(gathers, options(gpus), rank, k, kCount + 1);
    RC_ASSERT(e.collectives().culprits == std::vector<int>{rank});
    const std::string& verdict = e.collectives().verdict;
    RC_ASSERT(verdict.find("collective #" + std::to_string(k)) != std::string::npos);
    RC_ASSERT(verdict.find("rank " + std::to_string(rank) + " called all_gather of 1025 float32") !=
              std::string::npos);
    RC_ASSERT(verdict.find("all_gather of 1024 float32") != std::string::npos);
    std::filesystem::remove_all(e.run_dir());
  }));
}

// Over Gloo the rank given another size fails at once, while a late peer may not have
// entered yet: the verdict waits for it, and names the odd rank, not the late one.
TEST(Hang, ARankThatGivesAnotherSizeIsNamedThoughAPeerIsLate) {
  if (!faults_planned()) GTEST_SKIP() << "the fault plan is the simulated backend's";
  sgpu::Options o = options(3);
  o.sim.faults = "rank=2:slow=500ms@collective=1";
  const auto e = failure_of(gathers, o, 0, 1, kCount + 1);
  EXPECT_EQ(e.collectives().culprits, std::vector<int>{0}) << e.what();
  EXPECT_NE(e.collectives().verdict.find("rank 0 called all_gather of 1025 float32"),
            std::string::npos)
      << e.what();
  std::filesystem::remove_all(e.run_dir());
}

TEST(Hang, ACallWhoseCollectivesKeepCompletingIsNeverJudgedHung) {
  // Three times the hang timeout, in collectives 50 ms apart (the timeout leaves room for
  // ranks that start late on a loaded machine: the first collective waits for them). One
  // rank will do: on cuda it holds the recorder's completion poller to account (an NCCL
  // entry is ended by polling its Work, and one left in flight would be judged hung).
  SGPU_REQUIRE_RANKS(1);
  const int gpus = std::min(4, most_ranks());
  sgpu::Options o = options(gpus);
  o.hang_timeout = std::chrono::seconds(2);
  std::vector<int> ranks(static_cast<std::size_t>(gpus));
  std::iota(ranks.begin(), ranks.end(), 0);
  try {
    EXPECT_EQ(sgpu::distributed(steady, o).distributed(6000), ranks);
  } catch (const sgpu::DistributedError& e) {
    ADD_FAILURE() << e.what();
  }
}

TEST(Hang, ATimeoutCarriesTheVerdict) {
  if (!faults_planned()) GTEST_SKIP() << "the fault plan is the simulated backend's";
  sgpu::Options o = options(3);
  o.hang_timeout = sgpu::kNoTimeout;
  o.timeout = std::chrono::seconds(6);  // room for a loaded machine to reach collective #2
  o.sim.faults = "rank=1:hang@collective=2";
  const auto e = failure_of<sgpu::TimeoutError>(all_reduces, o, 4);
  EXPECT_EQ(e.collectives().culprits, std::vector<int>{1});
  EXPECT_NE(std::string(e.what()).find("rank 1 never entered collective #2"), std::string::npos)
      << e.what();
}

TEST(Hang, ATimeoutWithEveryRankOutsideACollectiveSaysSo) {
  SGPU_REQUIRE_RANKS(1);  // one GPU will do: its all-reduce must read as completed
  sgpu::Options o = options(std::min(2, most_ranks()));
  o.timeout = std::chrono::seconds(4);  // the first all-reduce ends well before
  const auto e = failure_of<sgpu::TimeoutError>(sleeps_after_one, o, 60'000);
  EXPECT_TRUE(e.collectives().culprits.empty());
  EXPECT_NE(e.collectives().verdict.find("no rank is in a collective"), std::string::npos)
      << e.what();
  EXPECT_NE(e.collectives().table.find("#1 all_reduce of 1024 float32 (sum), completed"),
            std::string::npos)
      << e.collectives().table;
}

TEST(Hang, ACrashedRanksPeersWaitingInACollectiveAreExplained) {
  if (!faults_planned()) GTEST_SKIP() << "the fault plan is the simulated backend's";
  sgpu::Options o = options(3);
  // Rank 2 lingers before it exits, so its peers are surely waiting in #3 when it dies: a
  // loaded machine could otherwise see the exit before they got there, with nothing to explain.
  o.sim.faults = "rank=2:slow=1s@collective=3;rank=2:exit=7@collective=3";
  const auto e = failure_of(all_reduces, o, 5);
  ASSERT_NE(e.root_cause(), nullptr);
  EXPECT_EQ(e.root_cause()->rank, 2);
  EXPECT_EQ(e.collectives().culprits, std::vector<int>{2}) << e.what();
  EXPECT_NE(e.collectives().verdict.find("rank 2 never entered collective #3"), std::string::npos)
      << e.what();
}

TEST(Hang, RecordingOffMeansNoVerdict) {
  if (!faults_planned()) GTEST_SKIP() << "the fault plan is the simulated backend's";
  sgpu::Options o = options(2);
  o.recorder_entries = 0;
  o.timeout = std::chrono::seconds(2);
  o.sim.faults = "rank=0:hang@collective=1";
  const auto e = failure_of<sgpu::TimeoutError>(all_reduces, o, 2);
  EXPECT_TRUE(e.collectives().verdict.empty());
  EXPECT_FALSE(std::filesystem::exists(e.run_dir() / "rank-0" / "collectives.ring"));
}

TEST(Hang, ABadHangTimeoutIsAConfigError) {
  sgpu::Options o = options(2);
  o.hang_timeout = std::chrono::milliseconds(0);
  EXPECT_THROW(sgpu::distributed(all_reduces, o).distributed(1), sgpu::ConfigError);
  ::setenv("SGPU_HANG_TIMEOUT", "soon", 1);
  try {
    sgpu::distributed(all_reduces, options(2)).distributed(1);
    ADD_FAILURE() << "SGPU_HANG_TIMEOUT=soon was taken";
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SGPU_HANG_TIMEOUT=soon"), std::string::npos);
  }
  ::unsetenv("SGPU_HANG_TIMEOUT");
}

}  // namespace
