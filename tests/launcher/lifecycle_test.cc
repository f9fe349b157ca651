// Many calls in a row leave nothing behind: no process, no descriptor, no listening port.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include "contract/option_table.h"
#include "launcher/rank_starter.h"
#include "sgpu/sgpu.h"
#include "testing/process_table.h"
#include "testing/sim_options.h"

namespace {

int twice(int x) { return 2 * x + sgpu::global_rank(); }

// Inodes of the sockets this process holds that are listening (TCP, v4 and v6).
std::set<std::string> listening_sockets() {
  std::set<std::string> mine;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) mine.insert(target.substr(8, target.size() - 9));
  }
  std::set<std::string> listening;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >>
          inode;
      if (state == "0A" && mine.count(inode)) listening.insert(inode);
    }
  }
  return listening;
}

// 200 calls with forked ranks; 40 with exec'd ones, each of which loads libtorch afresh
// (about half a second a rank, where a fork takes milliseconds). 40 still catch a leak
// that happens on one call in ten.
TEST(Lifecycle, ManyCallsInARowLeakNothing) {
  sgpu::Options options = sgpu::testing::sim(1);
  const bool exec = sgpu::launcher::resolve_start_method(
                        sgpu::contract::with_environment(options)) == sgpu::StartMethod::kExec;
  const int calls = exec ? 40 : 200;
  auto job = sgpu::distributed(twice, options);
  EXPECT_EQ(job.distributed(1), (std::vector<int>{2}));  // warm up lazily created state
  const int fds = sgpu::testing::open_fd_count();
  const auto listening = listening_sockets();
  for (int i = 0; i < calls; ++i) {
    ASSERT_EQ(job.distributed(i), (std::vector<int>{2 * i}));
  }
  EXPECT_EQ(sgpu::testing::open_fd_count(), fds);
  EXPECT_EQ(listening_sockets(), listening);
  EXPECT_TRUE(sgpu::testing::children().empty());
}

TEST(Lifecycle, NoListeningPortOutlivesACall) {
  sgpu::Options options = sgpu::testing::sim(2);
  const auto before = listening_sockets();
  auto launch = sgpu::distributed(twice, options).launch(3);
  EXPECT_EQ(launch.wait(), (std::vector<int>{6, 7}));
  EXPECT_EQ(listening_sockets(), before);
}

}  // namespace
