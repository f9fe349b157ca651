#include "launcher/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <system_error>

namespace sgpu::launcher {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int UniqueFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

int lifeline_read_fd() {
  // Created once and kept for the life of the process: the write end closes only when the
  // caller exits, however it exits.
  static const int read_end = [] {
    Pipe pipe = make_pipe();
    pipe.write.release();
    return pipe.read.release();
  }();
  return read_end;
}

pid_t spawn_process(const SpawnRequest& request) {
  std::vector<char*> argv;
  for (const std::string& arg : request.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& var : request.env) envp.push_back(const_cast<char*>(var.c_str()));
  envp.push_back(nullptr);
  // Copies above every target number first, so that placing one fd at 3 cannot overwrite
  // another that is still to be placed.
  std::vector<UniqueFd> sources;
  for (int fd :
       request.inherit_fds.empty() ? std::vector<int>{lifeline_read_fd()} : request.inherit_fds) {
    sources.emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 16));
    if (!sources.back()) throw std::system_error(errno, std::generic_category(), "dup");
  }

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, request.stdout_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, request.stderr_fd, 2);
  int target = 3;
  for (const UniqueFd& source : sources) {
    posix_spawn_file_actions_adddup2(&actions, source.get(), target++);
  }
  posix_spawn_file_actions_addclosefrom_np(&actions, target);
  sigset_t all;
  sigfillset(&all);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_USEVFORK;
  if (request.new_process_group) {
    posix_spawnattr_setpgroup(&attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);
  pid_t pid = 0;
  const int rc =
      ::posix_spawn(&pid, request.program.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    throw std::system_error(rc, std::generic_category(), "cannot start " + request.program);
  }
  return pid;
}

UniqueFd open_exit_fd(pid_t pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "pidfd_open");
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return UniqueFd(fd);
}

std::optional<ExitStatus> peek_exit(pid_t pid) {
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno != EINTR) return std::nullopt;
  }
  if (info.si_pid == 0) return std::nullopt;
  ExitStatus status;
  if (info.si_code == CLD_EXITED) {
    status.exit_code = info.si_status;
  } else {
    status.signal = info.si_status;
  }
  return status;
}

void signal_group(pid_t pid, int signal) { ::kill(-pid, signal); }

void reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

int shell_status(int wait_status) {
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 1;
}

}  // namespace sgpu::launcher
