// The pipeline end to end on simulated ranks: results in rank order, the rank
// environment, output streaming, asynchronous launches and result limits.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <spawn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <regex>
#include <sstream>
#include <thread>

#include "serialize/record.h"
#include "sgpu/sgpu.h"
#include "testing/process_table.h"
#include "testing/sim_options.h"

namespace {

struct RankView {
  int rank = -1, local_rank = -1, world = -1, local_world = -1, node = -1;
  std::string master_addr, master_port, omp_threads, device;
  int intra_op_threads = 0;
  std::uint64_t payload_size = 0;
  std::uint64_t payload_sum = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(rank, local_rank, world, local_world, node, master_addr, master_port, omp_threads,
       intra_op_threads, device, payload_size, payload_sum);
  }
};

std::uint64_t checksum(const std::string& bytes) {
  std::uint64_t sum = 0;
  for (unsigned char c : bytes) sum = sum * 131 + c;
  return sum;
}

std::string env_or(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "<unset>";
}

RankView inspect(std::string payload) {
  RankView v;
  v.rank = sgpu::global_rank();
  v.local_rank = sgpu::local_rank();
  v.world = sgpu::world_size();
  v.local_world = sgpu::local_world_size();
  v.node = sgpu::node_rank();
  v.master_addr = env_or("MASTER_ADDR");
  v.master_port = env_or("MASTER_PORT");
  v.omp_threads = env_or("OMP_NUM_THREADS");
  v.intra_op_threads = at::get_num_threads();
  v.device = sgpu::device();
  v.payload_size = payload.size();
  v.payload_sum = checksum(payload);
  return v;
}

using sgpu::testing::sim;

RC_GTEST_PROP(Launcher, ResultsComeBackInRankOrderWithTheRankVariables, ()) {
  const int gpus = *rc::gen::inRange(1, 9);
  const auto size = *rc::gen::inRange<std::size_t>(0, 3 << 20);
  const auto seed = *rc::gen::arbitrary<unsigned char>();
  std::string payload(size, '\0');
  for (std::size_t i = 0; i < size; ++i) payload[i] = static_cast<char>(seed + i * 7);

  auto options = sim(gpus);
  options.console_ranks = std::vector<int>{};
  const std::vector<RankView> views = sgpu::distributed(inspect, options).distributed(payload);
  RC_ASSERT(views.size() == static_cast<std::size_t>(gpus));
  for (int i = 0; i < gpus; ++i) {
    const RankView& v = views[static_cast<std::size_t>(i)];
    RC_ASSERT(v.rank == i);
    RC_ASSERT(v.local_rank == i);
    RC_ASSERT(v.world == gpus);
    RC_ASSERT(v.local_world == gpus);
    RC_ASSERT(v.node == 0);
    RC_ASSERT(v.master_addr == "127.0.0.1");
    RC_ASSERT(std::atoi(v.master_port.c_str()) > 0);
    // The caller's OMP_NUM_THREADS wins; unset, several ranks get 1 (torchrun's rule).
    const char* caller_omp = std::getenv("OMP_NUM_THREADS");
    RC_ASSERT(v.omp_threads == (caller_omp != nullptr ? caller_omp : gpus > 1 ? "1" : "<unset>"));
    // ... and libtorch's thread pool follows it, started by exec or forked alike.
    if (v.omp_threads != "<unset>")
      RC_ASSERT(v.intra_op_threads == std::atoi(v.omp_threads.c_str()));
    RC_ASSERT(v.device == "cpu");
    RC_ASSERT(v.payload_size == size);
    RC_ASSERT(v.payload_sum == checksum(payload));
  }
}

int say_lines(int count) {
  for (int i = 0; i < count; ++i) {
    std::cout << "rank " << sgpu::global_rank() << " line " << i << " " << std::string(40, 'x')
              << "\n";
    if (i % 3 == 0) std::cerr << "rank " << sgpu::global_rank() << " err " << i << std::endl;
  }
  std::cout << "no newline at the end from " << sgpu::global_rank();
  return 0;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Launcher, StreamsWholePrefixedLinesAndSavesLogs) {
  auto options = sim(4);
  options.keep_run_dir = true;
  ::testing::internal::CaptureStdout();
  auto launch = sgpu::distributed(say_lines, options).launch(300);
  launch.wait();
  const std::string console = ::testing::internal::GetCapturedStdout();
  const std::regex line(R"(\[rank (\d)\] (rank \1 line \d+ x{40}|no newline at the end from \1))");
  int counted = 0;
  for (const std::string& l : lines_of(console)) {
    if (l.rfind("[rank ", 0) != 0) continue;  // gtest's own output
    EXPECT_TRUE(std::regex_match(l, line)) << "split or mixed line: " << l;
    ++counted;
  }
  EXPECT_EQ(counted, 4 * 301);
  for (int rank = 0; rank < 4; ++rank) {
    const auto dir = launch.run_dir() / ("rank-" + std::to_string(rank));
    const auto out = lines_of(sgpu::testing::read_file(dir / "stdout.log"));
    ASSERT_EQ(out.size(), 301u);
    EXPECT_EQ(out[5], "rank " + std::to_string(rank) + " line 5 " + std::string(40, 'x'));
    EXPECT_EQ(lines_of(sgpu::testing::read_file(dir / "stderr.log")).size(), 100u);
  }
  std::filesystem::remove_all(launch.run_dir());
}

TEST(Launcher, ConsoleRanksFiltersTheConsoleOnly) {
  auto options = sim(3);
  options.console_ranks = std::vector<int>{1};
  ::testing::internal::CaptureStdout();
  sgpu::distributed(say_lines, options).distributed(2);
  const std::string console = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(console.find("[rank 1] rank 1 line 0"), std::string::npos) << console;
  EXPECT_EQ(console.find("[rank 0]"), std::string::npos) << console;
  EXPECT_EQ(console.find("[rank 2]"), std::string::npos) << console;
}

TEST(Launcher, RunFolderIsRemovedAfterSuccessUnlessKept) {
  auto launch = sgpu::distributed(say_lines, sim(1)).launch(1);
  launch.wait();
  EXPECT_FALSE(std::filesystem::exists(launch.run_dir()));
}

int sleep_then_rank(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return sgpu::global_rank() * 10;
}

TEST(Launcher, ARankThatFinishesFirstIsNoFailure) {
  int (*fn)(int) = [](int ms) {
    if (sgpu::global_rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return sgpu::global_rank();
  };
  EXPECT_EQ(sgpu::distributed(fn, sim(3)).distributed(400), (std::vector<int>{0, 1, 2}));
}

// A C++ caller's "never" is the largest duration there is: no deadline, and the longest
// waits, never a deadline that overflows the clocks and has passed already.
TEST(Launcher, TheLargestDurationsMeanNoDeadline) {
  int (*fn)(int) = [](int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return sgpu::global_rank();
  };
  auto options = sim(2);
  options.timeout = std::chrono::milliseconds::max();
  options.hang_timeout = std::chrono::milliseconds::max();
  options.teardown_grace = std::chrono::milliseconds::max();
  options.rdzv_timeout = std::chrono::milliseconds::max();
  EXPECT_EQ(sgpu::distributed(fn, options).distributed(1500), (std::vector<int>{0, 1}));
}

// Every listening socket on MASTER_PORT, as the kernel lists it: "tcp 0100007F" is
// 127.0.0.1, "tcp6 000...000" the IPv6 wildcard (which takes IPv4 too).
std::vector<std::string> store_listeners() {
  std::ostringstream port;
  port << std::uppercase << std::hex << std::setw(4) << std::setfill('0')
       << std::stoi(env_or("MASTER_PORT"));
  std::vector<std::string> found;
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream in(std::string("/proc/net/") + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.find(':');
      if (state == "0A" && local.substr(colon + 1) == port.str()) {
        found.push_back(std::string(table) + " " + local.substr(0, colon));
      }
    }
  }
  return found;
}

// The store is reachable from this node only: anyone who can reach the node could
// otherwise read and write the call's rendezvous keys.
TEST(Launcher, TheRendezvousStoreListensOnLoopbackOnly) {
  const std::vector<std::vector<std::string>> seen =
      sgpu::distributed(store_listeners, sim(2, true)).distributed();
  for (const auto& listeners : seen) {
    EXPECT_EQ(listeners, (std::vector<std::string>{"tcp 0100007F"}));
  }
}

TEST(Launcher, AsynchronousLaunchWaitsAndReportsDone) {
  auto launch = sgpu::distributed(sleep_then_rank, sim(2)).launch(800);
  EXPECT_FALSE(launch.wait_for(std::chrono::milliseconds(100)));
  EXPECT_FALSE(launch.done());
  EXPECT_EQ(launch.wait(), (std::vector<int>{0, 10}));
  EXPECT_TRUE(launch.done());
  EXPECT_EQ(launch.gpu_type(), "H100");
}

TEST(Launcher, ThreeCallsAtOnceAllSucceed) {
  auto job = sgpu::distributed(sleep_then_rank, sim(2));
  auto a = job.launch(300);
  auto b = job.launch(200);
  auto c = job.launch(100);
  EXPECT_EQ(a.wait(), (std::vector<int>{0, 10}));
  EXPECT_EQ(b.wait(), (std::vector<int>{0, 10}));
  EXPECT_EQ(c.wait(), (std::vector<int>{0, 10}));
}

// A rank that starts a child of its own (carrying a marker, its process group the rank's),
// then sleeps: a teardown that signals the rank and not its process group leaves the child.
int start_a_child_then_sleep(int ms) {
  char marker[] = "SGPU_TEST_MARKER=cancel-test-child";
  char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("1000"), nullptr};
  char* envp[] = {marker, nullptr};
  pid_t child = 0;
  if (::posix_spawn(&child, "/bin/sleep", nullptr, nullptr, argv, envp) != 0) return -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return sgpu::global_rank();
}

TEST(Launcher, CancelTearsDownAndRaisesCancelled) {
  ::setenv("SGPU_TEST_MARKER", "cancel-test", 1);
  auto launch = sgpu::distributed(start_a_child_then_sleep, sim(2)).launch(60'000);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  launch.cancel();
  std::vector<pid_t> ranks;
  try {
    launch.wait();
    ADD_FAILURE() << "a cancelled call succeeded";
  } catch (const sgpu::CancelledError& e) {
    ranks = sgpu::testing::rank_pids(e);
  }
  ::unsetenv("SGPU_TEST_MARKER");
  ASSERT_EQ(ranks.size(), 2u);
  // Seen by process group: the marker is not in fork-server ranks' /proc environ.
  EXPECT_TRUE(sgpu::testing::alive_in_groups(ranks).empty());
  EXPECT_TRUE(sgpu::testing::processes_with("SGPU_TEST_MARKER=cancel-test").empty());
  EXPECT_TRUE(sgpu::testing::eventually(
      [] { return sgpu::testing::processes_with("SGPU_TEST_MARKER=cancel-test-child").empty(); },
      std::chrono::seconds(5)))
      << "a rank's child outlived the cancelled call";
  EXPECT_TRUE(sgpu::testing::children().empty());
}

std::string big_result(std::size_t size) { return std::string(size, 'r'); }

TEST(Launcher, ResultOverTheLimitNamesRankAndSize) {
  auto options = sim(2);
  options.max_payload_bytes = 1 << 20;
  try {
    sgpu::distributed(big_result, options).distributed(std::size_t{2} << 20);
    FAIL() << "no error";
  } catch (const sgpu::DistributedError& e) {
    const std::string what = e.what();
    ASSERT_NE(e.root_cause(), nullptr);
    EXPECT_EQ(e.root_cause()->exception_type, "sgpu::ResultTooLarge");
    // The 2 MiB string plus cereal's 8-byte length.
    EXPECT_NE(what.find("2097160 bytes (2 MiB)"), std::string::npos) << what;
    EXPECT_NE(what.find("raise Options::max_payload_bytes or return less"), std::string::npos)
        << what;
  }
}

// Rank 1 leaves a result record that ends early, as a rank killed mid-write on a
// filesystem without atomic rename would, and ends as a rank that returned.
int result_damaged_after_return(int) {
  if (sgpu::global_rank() == 1) {
    const std::string whole = sgpu::serialize::encode_record(sgpu::serialize::RecordKind::kResult,
                                                             sgpu::serialize::to_bytes(7));
    std::ofstream(std::filesystem::path(std::getenv("SGPU_RANK_DIR")) / "result.bin")
        << whole.substr(0, whole.size() - 3);
    std::cout.flush();
    ::_exit(0);
  }
  return 7;
}

TEST(Launcher, DamagedResultIsReportedNotRead) {
  try {
    sgpu::distributed(result_damaged_after_return, sim(2)).distributed(0);
    FAIL() << "no error";
  } catch (const sgpu::DistributedError& e) {
    ASSERT_NE(e.root_cause(), nullptr);
    EXPECT_EQ(e.root_cause()->rank, 1);
    EXPECT_EQ(e.root_cause()->kind, sgpu::RankFailure::Kind::kBadResult);
    EXPECT_NE(std::string(e.what()).find("truncated record"), std::string::npos) << e.what();
  }
}

}  // namespace
