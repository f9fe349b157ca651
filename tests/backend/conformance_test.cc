// The backend contract, over every backend built: rank binding, device, and the
// collectives a training loop needs on 1 to 8 ranks, compared with values computed in one
// process; and (sim) a fault at any rank and point ends in the launcher's error with
// nothing left running. The cuda instances skip where no GPU is visible.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/backend_table.h"
#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/process_table.h"
#include "testing/sim_options.h"

namespace {

constexpr int kN = 5;  // elements per rank

std::vector<float> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// What each rank reports: its device, then one vector per collective.
struct Report {
  std::string device;
  std::vector<std::vector<float>> results;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(device, results);
  }
};

Report run_collectives(int root) {
  c10d::Backend& group = sgpu::process_group();
  const int rank = sgpu::global_rank();
  const int world = sgpu::world_size();
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::Device(sgpu::device()));
  Report report{sgpu::device(), {}};

  std::vector<at::Tensor> sum{at::arange(kN, options) + 100.0 * rank};
  group.allreduce(sum)->wait();
  report.results.push_back(to_vector(sum[0]));

  at::Tensor mine = at::arange(kN, options) + 100.0 * rank;
  at::Tensor gathered = at::empty({kN * world}, options);
  group._allgather_base(gathered, mine)->wait();
  report.results.push_back(to_vector(gathered));

  at::Tensor scatter_in = at::arange(kN * world, options) + 1000.0 * rank;
  at::Tensor scatter_out = at::empty({kN}, options);
  group._reduce_scatter_base(scatter_out, scatter_in)->wait();
  report.results.push_back(to_vector(scatter_out));

  std::vector<at::Tensor> bcast{at::arange(kN, options) + 100.0 * rank};
  c10d::BroadcastOptions bopts;
  bopts.rootRank = root;
  group.broadcast(bcast, bopts)->wait();
  report.results.push_back(to_vector(bcast[0]));

  group.barrier()->wait();

  // Chunk k of rank r's input holds r*1000 + k*10 + j.
  at::Tensor a2a_in = at::empty({kN * world}, options);
  for (int k = 0; k < world; ++k) {
    a2a_in.slice(0, k * kN, (k + 1) * kN).copy_(at::arange(kN, options) + (rank * 1000.0 + k * 10));
  }
  at::Tensor a2a_out = at::empty({kN * world}, options);
  std::vector<int64_t> splits;  // equal splits
  group.alltoall_base(a2a_out, a2a_in, splits, splits)->wait();
  report.results.push_back(to_vector(a2a_out));
  return report;
}

// The same, computed in one process.
std::vector<std::vector<float>> expected(int rank, int world, int root) {
  std::vector<float> sum(kN), gathered, scatter(kN), bcast(kN), a2a;
  for (int j = 0; j < kN; ++j) {
    for (int r = 0; r < world; ++r) sum[j] += j + 100.0f * r;
    for (int r = 0; r < world; ++r) scatter[j] += (rank * kN + j) + 1000.0f * r;
    bcast[j] = j + 100.0f * root;
  }
  for (int r = 0; r < world; ++r) {
    for (int j = 0; j < kN; ++j) gathered.push_back(j + 100.0f * r);
  }
  for (int k = 0; k < world; ++k) {
    for (int j = 0; j < kN; ++j) a2a.push_back(k * 1000.0f + rank * 10 + j);
  }
  return {sum, gathered, scatter, bcast, a2a};
}

class Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  sgpu::Options options(int gpus) {
    sgpu::Options o;
    o.backend = GetParam();
    o.gpus = gpus;
    o.console_ranks = std::vector<int>{};
    return o;
  }
  void SetUp() override {
    const auto& backend = sgpu::backend::find_backend(GetParam());
    available_ = static_cast<int>(backend.inventory(sgpu::Options{}).gpus.size());
    if (available_ == 0) GTEST_SKIP() << "backend " << GetParam() << " sees no GPU";
    ::unsetenv("SGPU_BACKEND");  // the parameter decides
  }
  void TearDown() override { ::setenv("SGPU_BACKEND", "sim", 1); }
  int available_ = 0;
};

TEST_P(Conformance, CollectivesMatchOneProcessOnOneToEightRanks) {
  for (int world : {1, 2, 3, 4, 8}) {
    if (world > available_) break;
    const int root = world - 1;
    const std::vector<Report> reports =
        sgpu::distributed(run_collectives, options(world)).distributed(root);
    ASSERT_EQ(reports.size(), static_cast<std::size_t>(world));
    const auto& backend = sgpu::backend::find_backend(GetParam());
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("world " + std::to_string(world) + ", rank " + std::to_string(rank));
      EXPECT_EQ(reports[rank].device, backend.device(rank));
      const auto want = expected(rank, world, root);
      const char* names[] = {"all-reduce", "all-gather", "reduce-scatter", "broadcast",
                             "all-to-all"};
      for (std::size_t op = 0; op < want.size(); ++op) {
        EXPECT_EQ(reports[rank].results.at(op), want[op]) << names[op];
      }
    }
  }
}

// A host tensor's all-reduce, then a device tensor's, then a barrier, on the one group:
// what dcp.async_save's staging and object collectives need of a group made with "sgpu".
std::vector<float> host_and_device_sums(int /*unused*/) {
  c10d::Backend& group = sgpu::process_group();
  const double rank = sgpu::global_rank();
  std::vector<at::Tensor> host{at::full({2}, rank + 1.0, at::kFloat)};
  std::vector<at::Tensor> device{
      at::full({2}, 10.0 * (rank + 1.0), at::TensorOptions().device(sgpu::device()))};
  group.allreduce(host)->wait();
  group.allreduce(device)->wait();
  group.barrier()->wait();
  return {host[0][0].item<float>(), device[0][0].to(at::kCPU).item<float>()};
}

TEST_P(Conformance, HostAndDeviceTensorsShareTheRanksGroup) {
  const int world = std::min(available_, 2);
  const auto sums = sgpu::distributed(host_and_device_sums, options(world)).distributed(0);
  const float host = world == 1 ? 1.0f : 3.0f;
  for (const auto& rank : sums) EXPECT_EQ(rank, (std::vector<float>{host, 10.0f * host}));
}

std::vector<std::string> built_backends() {
  std::vector<std::string> names;
  for (const auto& entry : sgpu::backend::backend_table()) names.emplace_back(entry.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance, ::testing::ValuesIn(built_backends()),
                         [](const auto& info) { return info.param; });

// --- faults (sim) -----------------------------------------------------------------------

int allreduce_steps(int steps) {
  c10d::Backend& group = sgpu::process_group();
  for (int i = 0; i < steps; ++i) {
    std::vector<at::Tensor> t{at::ones({4})};
    group.allreduce(t)->wait();
  }
  return sgpu::global_rank();
}

RC_GTEST_PROP(SimFaults, AnyFaultAtAnyRankAndPointEndsInTheLaunchersError, ()) {
  const int gpus = *rc::gen::inRange(2, 5);
  const int rank = *rc::gen::inRange(0, gpus);
  const std::string action =
      *rc::gen::element<std::string>("abort", "segv", "exit=7", "throw", "hang");
  const int collective = *rc::gen::inRange(0, 4);  // 0: at start
  const std::string plan = "rank=" + std::to_string(rank) + ":" + action +
                           (collective == 0 ? "" : "@collective=" + std::to_string(collective));
  const std::string marker = "fault-" + std::to_string(::getpid()) + "-" + plan;
  sgpu::Options options = sgpu::testing::sim(gpus, true);
  options.sim.faults = plan;
  // The timeout is the hang's; a fault must not race it while a loaded machine starts ranks.
  options.timeout = std::chrono::seconds(action == "hang" ? 3 : 60);
  ::setenv("SGPU_TEST_MARKER", marker.c_str(), 1);
  std::vector<pid_t> ranks;
  try {
    sgpu::distributed(allreduce_steps, options).distributed(5);
    RC_FAIL("the call succeeded under " + plan);
  } catch (const sgpu::TimeoutError& e) {
    ranks = sgpu::testing::rank_pids(e);
    // A hang stops everyone: the rank that hangs and its peers waiting in the collective.
    if (action != "hang") RC_FAIL(plan + " timed out: " + e.what());
  } catch (const sgpu::DistributedError& e) {
    ranks = sgpu::testing::rank_pids(e);
    if (action == "hang") RC_FAIL(plan + " did not time out: " + e.what());
    const sgpu::RankFailure* root = e.root_cause();
    if (root == nullptr) RC_FAIL(plan + ": no root cause in: " + e.what());
    RC_ASSERT(root->rank == rank);
    if (action == "abort") RC_ASSERT(root->signal == SIGABRT);
    if (action == "segv") RC_ASSERT(root->signal == SIGSEGV);
    if (action == "exit=7") RC_ASSERT(root->exit_code == 7);
    if (action == "throw") RC_ASSERT(root->message.find("sgpu sim fault") != std::string::npos);
  }
  ::unsetenv("SGPU_TEST_MARKER");
  RC_ASSERT(ranks.size() == static_cast<std::size_t>(gpus));
  RC_ASSERT(sgpu::testing::eventually([&] { return sgpu::testing::alive_in_groups(ranks).empty(); },
                                      std::chrono::seconds(2)));
  RC_ASSERT(sgpu::testing::eventually(
      [&] { return sgpu::testing::processes_with("SGPU_TEST_MARKER=" + marker).empty(); },
      std::chrono::seconds(2)));
  RC_ASSERT(sgpu::testing::children().empty());
}

TEST(SimFaults, SlowRanksStillFinish) {
  sgpu::Options options = sgpu::testing::sim(2);
  options.sim.faults = "rank=1:slow=100ms@collective=2";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sgpu::distributed(allreduce_steps, options).distributed(3), (std::vector<int>{0, 1}));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
}

TEST(SimFaults, TimedCrashHappensAfterItsTime) {
  sgpu::Options options = sgpu::testing::sim(2);
  options.sim.faults = "rank=0:exit=9@after=300ms";
  int (*sleepy)(int) = [](int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return 0;
  };
  try {
    sgpu::distributed(sleepy, options).distributed(5000);
    FAIL() << "no error";
  } catch (const sgpu::DistributedError& e) {
    ASSERT_NE(e.root_cause(), nullptr);
    EXPECT_EQ(e.root_cause()->rank, 0);
    EXPECT_EQ(e.root_cause()->exit_code, 9);
  }
}

TEST(SimFaults, BadPlansAreConfigErrorsBeforeAnythingStarts) {
  sgpu::Options options = sgpu::testing::sim(2);
  for (const char* plan :
       {"rank=2:abort", "rank=0:explode", "rank=0:throw@after=1s", "rank=0:hang@after=1s",
        "rank=0:abort@collective=0", "0:abort", "rank=0:slow=fast"}) {
    options.sim.faults = plan;
    EXPECT_THROW(sgpu::distributed(allreduce_steps, options).distributed(1), sgpu::ConfigError)
        << plan;
    EXPECT_TRUE(sgpu::testing::children().empty());
  }
}

// The launcher asks a backend whether a call's ranks compute shapes only, not its
// environment's text: none does by default; sim does where sim_compute says "shapes" (its
// environment variable standing in), and refuses what is neither, naming the option.
TEST(BackendQuestions, OnlySimsShapeOnlyComputeComputesShapes) {
  const sgpu::Options plain;
  for (const auto& entry : sgpu::backend::backend_table()) {
    EXPECT_FALSE(sgpu::backend::find_backend(entry.name).computes_shapes(plain)) << entry.name;
  }
  const sgpu::backend::Backend& sim = sgpu::backend::find_backend("sim");
  sgpu::Options options;
  options.sim.compute = "shapes";
  EXPECT_TRUE(sim.computes_shapes(options));
  options.sim.compute = "values";
  EXPECT_FALSE(sim.computes_shapes(options));
  options.sim.compute = "rows";
  try {
    sim.computes_shapes(options);
    ADD_FAILURE() << "\"rows\" was taken for what ranks compute";
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sim.compute=\"rows\""), std::string::npos) << e.what();
  }
}

}  // namespace
