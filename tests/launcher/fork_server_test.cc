// What a rank sees does not depend on the start method, and the fork server is one per
// caller, shared by its calls. Runs under both start methods (see tests/CMakeLists.txt).
#include "launcher/fork_server.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "sgpu/sgpu.h"
#include "testing/process_table.h"
#include "testing/sim_options.h"

namespace {

struct Seen {
  std::string value, cwd;
  int parent = 0;  // the rank's parent process
  template <class Archive>
  void serialize(Archive& ar) {
    ar(value, cwd, parent);
  }
};

Seen look_around(int) {
  const char* value = std::getenv("SGPU_TEST_VALUE");
  return Seen{value != nullptr ? value : "<unset>", std::filesystem::current_path().string(),
              static_cast<int>(::getppid())};
}

using sgpu::testing::sim;

bool forking() {
  const char* method = std::getenv("SGPU_START_METHOD");
  return method == nullptr || std::string(method) != "exec";
}

TEST(StartMethod, RanksSeeTheCallersEnvironmentAndDirectoryAtCallTime) {
  auto job = sgpu::distributed(look_around, sim(2));
  job.distributed(0);  // the server, if any, starts here, before the changes below
  const auto old_cwd = std::filesystem::current_path();
  const auto dir =
      std::filesystem::temp_directory_path() / ("sgpu-cwd-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);
  ::setenv("SGPU_TEST_VALUE", "changed after the first call", 1);
  const std::vector<Seen> seen = job.distributed(0);
  ::unsetenv("SGPU_TEST_VALUE");
  std::filesystem::current_path(old_cwd);
  std::filesystem::remove_all(dir);
  // Forked by the server, or exec'd by this process.
  const int parent = forking() ? sgpu::launcher::fork_server_pid() : ::getpid();
  for (const Seen& s : seen) {
    EXPECT_EQ(s.value, "changed after the first call");
    EXPECT_EQ(s.cwd, dir.string());
    EXPECT_EQ(s.parent, parent);
  }
}

TEST(StartMethod, OneForkServerServesEveryCall) {
  sgpu::distributed(look_around, sim(1)).distributed(0);
  const pid_t server = sgpu::launcher::fork_server_pid();
  if (!forking()) {
    EXPECT_EQ(server, 0) << "the exec start method started a fork server";
    return;
  }
  ASSERT_NE(server, 0);
  auto job = sgpu::distributed(look_around, sim(3));
  auto a = job.launch(0);
  auto b = job.launch(0);
  a.wait();
  b.wait();
  EXPECT_EQ(sgpu::launcher::fork_server_pid(), server);
  EXPECT_TRUE(sgpu::testing::children().empty());
}

// Under either run of this file: with SGPU_START_METHOD unset, the option decides, and an
// exec'd rank's parent is this process, where a forked one's is the server.
TEST(StartMethod, OptionChoosesExecWhenTheEnvironmentDoesNotSay) {
  const char* saved = std::getenv("SGPU_START_METHOD");
  const std::string keep = saved != nullptr ? saved : "";
  ::unsetenv("SGPU_START_METHOD");
  auto options = sim(2);
  options.start_method = sgpu::StartMethod::kExec;
  const std::vector<Seen> exec_seen = sgpu::distributed(look_around, options).distributed(0);
  options.start_method = sgpu::StartMethod::kForkServer;
  const std::vector<Seen> fork_seen = sgpu::distributed(look_around, options).distributed(0);
  if (saved != nullptr) ::setenv("SGPU_START_METHOD", keep.c_str(), 1);
  ASSERT_EQ(exec_seen.size(), 2u);
  for (const Seen& s : exec_seen) EXPECT_EQ(s.parent, ::getpid());
  ASSERT_EQ(fork_seen.size(), 2u);
  ASSERT_NE(sgpu::launcher::fork_server_pid(), 0);
  for (const Seen& s : fork_seen) EXPECT_EQ(s.parent, sgpu::launcher::fork_server_pid());
}

TEST(StartMethod, UnknownStartMethodIsAConfigError) {
  const char* saved = std::getenv("SGPU_START_METHOD");
  const std::string keep = saved != nullptr ? saved : "";
  ::setenv("SGPU_START_METHOD", "spawn", 1);
  try {
    sgpu::distributed(look_around, sim(1)).distributed(0);
    ADD_FAILURE() << "no error";
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"fork-server\" or \"exec\""), std::string::npos);
  }
  if (saved != nullptr) {
    ::setenv("SGPU_START_METHOD", keep.c_str(), 1);
  } else {
    ::unsetenv("SGPU_START_METHOD");
  }
}

}  // namespace
