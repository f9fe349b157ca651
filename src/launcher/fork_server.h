// The fork server: ranks start in milliseconds because the binary is loaded once.
//
// At the first call that uses it, the caller runs its own binary once more with
// SGPU_ROLE=fork-server; sgpu::init sends that process into run_fork_server(). The server
// is single-threaded, never touches CUDA or a process group, and forks one rank per
// request. Each call gets its own channel (a SOCK_SEQPACKET socket passed over the
// control socket); a request carries the call's environment and working directory and the
// rank's stdout/stderr, so a forked rank sees what an exec'd one would. The server tells
// the call when each rank exits and keeps it a zombie until the call releases it.
//
// Lifetime: the server lives exactly as long as the caller. It watches the control socket
// (only the caller holds the other end, close-on-exec): end-of-file means the caller is
// gone, and the server SIGKILLs every rank's group, reaps them and exits. It does not use
// a parent-death signal, which Linux ties to the thread that started it. It sits in its
// own process group, so a terminal's Ctrl-C reaches the caller, which tears down.
//
// If the server finds threads in itself (started by some static initialiser), forking it
// would be unsafe: it refuses, and the error names the exec start method.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/rank_starter.h"

namespace sgpu::launcher {

// In a rank's environment: modules (comma-separated) its fork server imports before it forks
// the rank, if it has not yet (ForkHooks::prepare), so that every later call's ranks find
// them loaded. A Python call names the heavy ones its function imports (mlflow).
inline constexpr const char* kForkServerImportsVar = "SGPU_FORK_SERVER_IMPORTS";

// A starter whose ranks come from this caller's fork server, started on first use.
std::unique_ptr<RankStarter> make_fork_server_starter();
// The starter `method` names: exec (rank_starter.h), else this caller's fork server.
std::unique_ptr<RankStarter> make_starter(StartMethod method);
// The same with another program as the server: `command` (its path, then its whole argv,
// argv[0] included) must
// answer as this binary's server does, by calling serve_forks() (the Python fork server,
// python -m sgpu._fork_server). One server per command.
std::unique_ptr<RankStarter> make_fork_server_starter(const std::vector<std::string>& command);

// The server's pid; 0 when none runs.
pid_t fork_server_pid();
pid_t fork_server_pid(const std::vector<std::string>& command);

bool started_as_fork_server();
// This binary as the server: serve_forks(), then the rank (run_rank) in each child.
[[noreturn]] void run_fork_server();

// What a host of the server loop adds around fork() and says when it cannot fork.
struct ForkHooks {
  std::function<void()> before_fork;        // e.g. PyOS_BeforeFork
  std::function<void()> after_fork_parent;  // PyOS_AfterFork_Parent
  std::function<void()> after_fork_child;   // PyOS_AfterFork_Child
  // Before a rank is forked: the modules kForkServerImportsVar names in its environment,
  // for the host to import in the server (before the check for threads).
  std::function<void(const std::vector<std::string>& modules)> prepare;
  std::string threads_hint;  // who may have started the threads found
  std::string exec_hint;     // how to ask for the exec start method
};

// The server loop, in a process started as a fork server (SGPU_ROLE=fork-server, the
// control socket at fd 3, the caller's lifeline at 4): never returns in the server, which
// exits when its caller is gone; returns in each forked child, its descriptors, working
// folder and signals set up, with the environment the rank must take on.
std::vector<std::string> serve_forks(const ForkHooks& hooks);

}  // namespace sgpu::launcher
