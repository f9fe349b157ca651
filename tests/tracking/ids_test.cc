// Run and experiment ids (tracking/ids.h): MLflow's shapes, and never the same twice, in
// any thread, process or forked child, however many of each draw them.
#include "tracking/ids.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace sgpu::tracking {
namespace {

TEST(Ids, HaveMlflowsShapes) {
  for (int i = 0; i < 200; ++i) {
    const std::string run = random_hex(32);
    ASSERT_EQ(run.size(), 32u);
    for (char c : run)
      ASSERT_TRUE(std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(c));
    const std::string experiment = random_experiment_id();
    ASSERT_EQ(experiment.size(), 18u);
    ASSERT_NE(experiment[0], '0');
    for (char c : experiment) ASSERT_TRUE(std::isdigit(static_cast<unsigned char>(c)));
  }
}

// Ids a forked child draws, read back from it through a pipe.
std::vector<std::string> drawn_in_a_child(int count) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string all;
    for (int i = 0; i < count; ++i) all += random_hex(32);
    ssize_t written = 0;
    while (written < static_cast<ssize_t>(all.size())) {
      const ssize_t n = ::write(pipe_fds[1], all.data() + written, all.size() - written);
      if (n <= 0) ::_exit(1);
      written += n;
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string all;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) all.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  std::vector<std::string> ids;
  for (std::size_t at = 0; at + 32 <= all.size(); at += 32) ids.push_back(all.substr(at, 32));
  return ids;
}

// The law: the parent draws, then forks children and starts threads that draw too, and
// every id of all of them is new (a seeded engine that fork() copies repeats them).
RC_GTEST_PROP(Ids, NoForkThreadOrProcessRepeatsOne,
              (std::uint8_t children_drawn, std::uint8_t threads_drawn)) {
  const int children = 1 + children_drawn % 3;
  const int threads = 1 + threads_drawn % 4;
  std::multiset<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.insert(random_hex(32));  // the parent's state before fork
  for (int c = 0; c < children; ++c) {
    for (const std::string& id : drawn_in_a_child(20)) ids.insert(id);
  }
  for (int i = 0; i < 5; ++i) ids.insert(random_hex(32));  // and after
  std::vector<std::vector<std::string>> per_thread(threads);
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&per_thread, t] {
      for (int i = 0; i < 20; ++i) per_thread[t].push_back(random_hex(32));
    });
  }
  for (std::thread& thread : running) thread.join();
  for (const auto& drawn : per_thread) ids.insert(drawn.begin(), drawn.end());
  RC_ASSERT(ids.size() == static_cast<std::size_t>(10 + 20 * children + 20 * threads));
  RC_ASSERT(std::set<std::string>(ids.begin(), ids.end()).size() == ids.size());
}

}  // namespace
}  // namespace sgpu::tracking
