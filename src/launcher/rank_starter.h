// How one call's rank processes come to be, and how their exits are learned.
//
// Two start methods share the monitor loop (monitor.h):
//   exec         each rank is the caller's binary exec'd from the call's monitor thread;
//                exits are seen through pidfds and peeked with waitid(WNOWAIT);
//   fork server  each rank is forked by a warm copy of the caller's binary
//                (fork_server.h), which reports exits over the call's channel.
// Either way an exited rank stays a zombie until release(), so its process-group id
// cannot be reused before the caller's final sweep has SIGKILLed the group.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "contract/process_tree.h"
#include "launcher/process.h"
#include "sgpu/options.h"

namespace sgpu::launcher {

struct RankExit {
  pid_t pid = 0;
  ExitStatus status;
};

class RankStarter {
 public:
  virtual ~RankStarter() = default;
  // Starts one rank; returns its pid. Throws std::runtime_error with the reason.
  virtual pid_t start(const SpawnRequest& request) = 0;
  // Adds what the monitor must poll to learn of exits.
  virtual void add_poll_fds(std::vector<pollfd>& fds) const = 0;
  // Exits seen since the last call; never blocks.
  virtual std::vector<RankExit> collect_exits() = 0;
  // Reaps every rank started (call after their groups were SIGKILLed).
  virtual void release() = 0;
  // Sends `signal` to the rank's process group.
  virtual void signal(pid_t pid, int signal) { signal_group(pid, signal); }
  // SIGKILLs everything the live rank started (a daemon in a session of its own too: while
  // the rank lives it is in its tree, a child subreaper's), then its group.
  virtual void kill_tree(pid_t pid) {
    contract::kill_descendants(pid);
    signal_group(pid, SIGKILL);
  }
};

std::unique_ptr<RankStarter> make_exec_starter();

// Options::start_method (as SGPU_START_METHOD leaves it): exec, else the fork server.
StartMethod resolve_start_method(const Options& options);

}  // namespace sgpu::launcher
