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

#include <memory>

#include "launcher/rank_starter.h"

namespace sgpu::launcher {

inline constexpr const char* kForkServerRole = "fork-server";

// A starter whose ranks come from this caller's fork server, started on first use.
std::unique_ptr<RankStarter> make_fork_server_starter();

// The server's pid; 0 when none runs.
pid_t fork_server_pid();

bool started_as_fork_server();
[[noreturn]] void run_fork_server();

}  // namespace sgpu::launcher
