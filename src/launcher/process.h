// Rank processes on POSIX: start, watch, signal, reap.
//
// Each rank leads its own process group, so a signal to the group reaches anything the
// rank started. An exited rank is observed without being reaped (waitid WNOWAIT): its
// zombie keeps the process-group id reserved until the final sweep, which SIGKILLs every
// group (grandchildren included) and only then reaps. Teardown is data, as in reproc:
// SIGTERM, wait `grace`, SIGKILL.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace sgpu::launcher {

// An owned file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release();
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};
// Both ends close-on-exec.
Pipe make_pipe();

// The caller's lifeline: a pipe whose write end only this process holds (close-on-exec).
// Ranks watch the read end; end-of-file there means the caller is gone.
int lifeline_read_fd();

struct SpawnRequest {
  std::string program;  // path to exec
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "NAME=value"
  int stdout_fd = -1;            // become the process's 1 and 2
  int stderr_fd = -1;
  std::vector<int> inherit_fds;  // become its 3, 4, ...; empty: the lifeline at 3
  bool new_process_group = true;
};

// Starts a process with stdin from /dev/null, stdout/stderr on the given fds, the
// inherited fds from 3 on, no other descriptor of the caller, default signal
// dispositions and an empty signal mask. Throws std::system_error.
pid_t spawn_process(const SpawnRequest& request);

// A pollable handle that becomes readable when the process exits (pidfd).
UniqueFd open_exit_fd(pid_t pid);

struct ExitStatus {
  std::optional<int> exit_code;  // set when the process exited
  std::optional<int> signal;     // set when a signal killed it
};

// How an exited, not yet reaped child ended; nullopt while it runs.
std::optional<ExitStatus> peek_exit(pid_t pid);

// Sends `signal` to the process group led by `pid` (no error when it is already gone).
void signal_group(pid_t pid, int signal);

// Reaps an exited child.
void reap(pid_t pid);

// A waitpid() status as a shell reports it: the exit code, 128 + the signal that killed
// the process, else 1.
int shell_status(int wait_status);

}  // namespace sgpu::launcher
