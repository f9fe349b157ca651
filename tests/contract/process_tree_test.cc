// A process's tree from /proc (contract/process_tree.h): its children are found, and every
// descendant is killed, one in a session of its own too, where the process itself is not.
#include "contract/process_tree.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

namespace sgpu::contract {
namespace {

// Alive, and not a zombie that waits for a reaper (pid 1 of a container may never reap).
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos &&
         line.find_first_not_of(' ', close + 1) != std::string::npos &&
         line[line.find_first_not_of(' ', close + 1)] != 'Z';
}

// Waits up to 10 s for `pid` (not this process's child) to be gone.
bool gone_within_10s(pid_t pid) {
  for (int i = 0; i < 1000 && alive(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !alive(pid);
}

TEST(ProcessTree, EveryDescendantIsKilledAnOrphanInASessionOfItsOwnToo) {
  int ends[2];
  ASSERT_EQ(::pipe(ends), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the child: a grandchild in a session of its own, then sleeps
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::setsid();
      ::pause();
      ::_exit(0);
    }
    [[maybe_unused]] ssize_t w = ::write(ends[1], &grandchild, sizeof grandchild);
    ::pause();
    ::_exit(0);
  }
  pid_t grandchild = 0;
  ASSERT_EQ(::read(ends[0], &grandchild, sizeof grandchild),
            static_cast<ssize_t>(sizeof grandchild));
  ::close(ends[0]);
  ::close(ends[1]);

  const std::vector<pid_t> children = children_of_this_process();
  EXPECT_NE(std::find(children.begin(), children.end(), child), children.end());
  EXPECT_EQ(std::find(children.begin(), children.end(), grandchild), children.end());

  kill_descendants(::getpid());
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(gone_within_10s(grandchild)) << "the grandchild in its own session lives on";
  EXPECT_TRUE(alive(::getpid()));
  EXPECT_TRUE(children_of_this_process().empty());
}

}  // namespace
}  // namespace sgpu::contract
