#include "launcher/fork_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

#include "contract/rank_env.h"
#include "rank/program.h"
#include "rank/rank_main.h"
#include "sgpu/internal/values.h"

extern char** environ;

namespace sgpu::launcher {
namespace {

// The server's descriptors: the control socket and the caller's lifeline.
constexpr int kControlFd = 3;
constexpr int kServerLifelineFd = 4;
constexpr std::size_t kMaxMessage = std::size_t{1} << 20;
constexpr auto kReplyLimit = std::chrono::seconds(60);

struct Message {
  enum Kind : int { kHello = 1, kChannel, kSpawn, kSpawned, kExited, kRelease, kReleased, kError };
  int kind = 0;
  int pid = 0;
  int exit_code = -1;  // -1: killed by `signal`
  int signal = 0;
  std::string text;
  std::vector<std::string> env;
  std::string cwd;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(kind, pid, exit_code, signal, text, env, cwd);
  }
};

void send_message(int socket, const Message& message, const std::vector<int>& fds = {}) {
  std::string bytes = serialize::to_bytes(message);
  if (bytes.size() > kMaxMessage) {
    throw std::runtime_error("sgpu fork server: a request of " + std::to_string(bytes.size()) +
                             " bytes (the environment is that large) exceeds its limit of " +
                             std::to_string(kMaxMessage) + "; use the exec start method");
  }
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* header = CMSG_FIRSTHDR(&msg);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  while (::sendmsg(socket, &msg, MSG_NOSIGNAL) < 0) {
    if (errno == EINTR) continue;
    throw std::system_error(errno, std::generic_category(), "sgpu fork server: send");
  }
}

enum class Received { kMessage, kNothing, kClosed };

Received receive_message(int socket, Message& message, std::vector<UniqueFd>* fds, bool block) {
  thread_local std::vector<char> buffer(kMaxMessage);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | (block ? 0 : MSG_DONTWAIT))) < 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Received::kNothing;
    if (errno == ECONNRESET) return Received::kClosed;
    throw std::system_error(errno, std::generic_category(), "sgpu fork server: receive");
  }
  if (n == 0) return Received::kClosed;
  for (cmsghdr* header = CMSG_FIRSTHDR(&msg); header != nullptr;
       header = CMSG_NXTHDR(&msg, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof fd);
      if (fds != nullptr) {
        fds->emplace_back(fd);
      } else {
        ::close(fd);
      }
    }
  }
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    throw std::runtime_error("sgpu fork server: a message was cut short");
  }
  message =
      serialize::from_bytes<Message>(std::string_view(buffer.data(), static_cast<std::size_t>(n)));
  return Received::kMessage;
}

// Waits for one message; kClosed when the peer is gone. Throws after kReplyLimit.
Received await_message(int socket, Message& message) {
  pollfd p{socket, POLLIN, 0};
  const int ms = static_cast<int>(std::chrono::milliseconds(kReplyLimit).count());
  while (true) {
    const int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) throw std::runtime_error("sgpu fork server: no answer within 60 s");
    return receive_message(socket, message, nullptr, true);
  }
}

std::pair<UniqueFd, UniqueFd> make_socket_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair");
  }
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

// ---------------------------------------------------------------------------------------
// The caller's side.

class ServerHandle {
 public:
  // The server for `command` (this binary's: "/proc/self/exe" and program_args()), started
  // on first use; one per command, each living as long as the process.
  static ServerHandle& instance(const std::vector<std::string>& command) {
    static std::mutex mutex;
    static auto* handles = new std::map<std::vector<std::string>, ServerHandle*>;
    std::lock_guard lock(mutex);
    ServerHandle*& handle = (*handles)[command];
    if (handle == nullptr) handle = new ServerHandle(command);
    return *handle;
  }

  UniqueFd open_channel() {
    std::lock_guard lock(mutex_);
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (!running_locked()) start_locked();
      auto [mine, theirs] = make_socket_pair();
      try {
        send_message(control_.get(), Message{.kind = Message::kChannel}, {theirs.get()});
        return std::move(mine);
      } catch (const std::system_error&) {
        stop_locked();  // the server died; start another once
      }
    }
    throw std::runtime_error("sgpu fork server: cannot reach a fork server");
  }

  pid_t pid() {
    std::lock_guard lock(mutex_);
    return running_locked() ? pid_ : 0;
  }

  // A channel closed under a call: the server is dying (its descriptors close before it
  // ends). Reaps it, waiting up to 2 s, so no zombie of it outlives the call.
  void reap_dying() {
    std::lock_guard lock(mutex_);
    for (int i = 0; i < 200 && running_locked(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  explicit ServerHandle(std::vector<std::string> command) : command_(std::move(command)) {}

  bool running_locked() {
    if (pid_ == 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      control_.reset();
      return false;
    }
    return true;
  }

  void stop_locked() {
    if (pid_ != 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = 0;
    control_.reset();
  }

  void start_locked() {
    auto [mine, theirs] = make_socket_pair();
    SpawnRequest request;
    request.program = command_.front();
    request.argv.assign(command_.begin() + 1, command_.end());
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      if (std::strncmp(*entry, "SGPU_ROLE=", 10) != 0) request.env.emplace_back(*entry);
    }
    request.env.push_back(std::string(contract::kRoleVar) + "=" + contract::kForkServerRole);
    request.stdout_fd = STDOUT_FILENO;
    request.stderr_fd = STDERR_FILENO;
    request.inherit_fds = {theirs.get(), lifeline_read_fd()};
    pid_ = spawn_process(request);
    theirs.reset();
    control_ = std::move(mine);
    Message hello;
    if (await_message(control_.get(), hello) != Received::kMessage ||
        hello.kind != Message::kHello) {
      stop_locked();
      throw std::runtime_error(
          "sgpu fork server: it did not start (does main() call sgpu::init(argc, argv) first?)");
    }
  }

  const std::vector<std::string> command_;  // the program, then its argv
  std::mutex mutex_;
  pid_t pid_ = 0;
  UniqueFd control_;
};

std::vector<std::string> own_server_command() {
  std::vector<std::string> command{"/proc/self/exe"};
  command.insert(command.end(), rank::program_args().begin(), rank::program_args().end());
  return command;
}

class ForkServerStarter final : public RankStarter {
 public:
  explicit ForkServerStarter(const std::vector<std::string>& command)
      : server_(ServerHandle::instance(command)), channel_(server_.open_channel()) {}
  ~ForkServerStarter() override { release(); }

  pid_t start(const SpawnRequest& request) override {
    Message spawn{.kind = Message::kSpawn};
    spawn.env = request.env;
    char cwd[4096];
    spawn.cwd = ::getcwd(cwd, sizeof cwd) != nullptr ? cwd : "/";
    send_message(channel_.get(), spawn, {request.stdout_fd, request.stderr_fd});
    while (true) {
      Message reply;
      if (await_message(channel_.get(), reply) == Received::kClosed) {
        server_gone();
        throw std::runtime_error("sgpu fork server: it died while starting a rank");
      }
      if (reply.kind == Message::kExited) {
        note_exit(reply);
      } else if (reply.kind == Message::kSpawned) {
        started_.push_back(reply.pid);
        return reply.pid;
      } else if (reply.kind == Message::kError) {
        throw std::runtime_error(reply.text);
      }
    }
  }

  void add_poll_fds(std::vector<pollfd>& fds) const override {
    if (channel_) fds.push_back({channel_.get(), POLLIN, 0});
  }

  std::vector<RankExit> collect_exits() override {
    while (channel_) {
      Message message;
      const Received got = receive_message(channel_.get(), message, nullptr, false);
      if (got == Received::kNothing) break;
      if (got == Received::kClosed) {
        server_gone();
        break;
      }
      if (message.kind == Message::kExited) note_exit(message);
    }
    return std::exchange(pending_, {});
  }

  void release() override {
    if (!channel_) return;
    try {
      send_message(channel_.get(), Message{.kind = Message::kRelease});
      Message reply;
      while (await_message(channel_.get(), reply) == Received::kMessage &&
             reply.kind != Message::kReleased) {
      }
    } catch (const std::exception&) {
      // A server that cannot answer has died, and its ranks with it.
    }
    channel_.reset();
  }

 private:
  void note_exit(const Message& message) {
    RankExit exit{message.pid, {}};
    if (message.exit_code >= 0) {
      exit.status.exit_code = message.exit_code;
    } else {
      exit.status.signal = message.signal;
    }
    pending_.push_back(exit);
    reported_.push_back(message.pid);
  }

  // The server died: its ranks died with it (their parent-death signal kills their groups).
  void server_gone() {
    channel_.reset();
    server_.reap_dying();
    for (pid_t pid : started_) {
      const bool seen =
          std::any_of(reported_.begin(), reported_.end(), [&](pid_t p) { return p == pid; });
      if (!seen) pending_.push_back({pid, ExitStatus{std::nullopt, SIGKILL}});
    }
  }

  ServerHandle& server_;
  UniqueFd channel_;
  std::vector<pid_t> started_;
  std::vector<pid_t> reported_;
  std::vector<RankExit> pending_;
};

// ---------------------------------------------------------------------------------------
// The server's side.

// The server's threads that make a fork unsafe: every one but jemalloc's background thread
// (pyarrow's allocator starts one at load, and mlflow imports pyarrow), which jemalloc's own
// fork handlers stop and restart around fork().
int thread_count() {
  int threads = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name != "jemalloc_bg_thd") ++threads;
  }
  return ec ? 1 : threads;
}

struct Child {
  pid_t pid = 0;
  UniqueFd exit_fd;
  bool exit_reported = false;
};

struct Channel {
  UniqueFd socket;
  std::vector<Child> children;
};

void kill_and_reap(Channel& channel) {
  for (Child& child : channel.children) signal_group(child.pid, SIGKILL);
  for (Child& child : channel.children) reap(child.pid);
  channel.children.clear();
}

// In the forked child: the request's descriptors, working folder and clean signal state;
// returns the environment the rank must have (the request's, with this server as the
// parent a rank checks for).
std::vector<std::string> become_rank(const Message& request, std::vector<UniqueFd>& fds) {
  ::setpgid(0, 0);
  for (int signal = 1; signal < NSIG; ++signal) ::signal(signal, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const int null_fd = ::open("/dev/null", O_RDONLY);
  ::dup2(null_fd, 0);
  ::dup2(fds.at(0).get(), 1);
  ::dup2(fds.at(1).get(), 2);
  ::dup2(kServerLifelineFd, contract::kRankLifelineFd);
  ::closefrom(contract::kRankLifelineFd + 1);
  for (UniqueFd& fd : fds) fd.release();  // closed just above
  if (::chdir(request.cwd.c_str()) != 0) {
    const std::string text =
        "sgpu: cannot enter " + request.cwd + ": " + std::strerror(errno) + "\n";
    [[maybe_unused]] ssize_t n = ::write(2, text.data(), text.size());
    ::_exit(127);
  }
  std::vector<std::string> env;
  const std::string parent = std::string(contract::kParentVar) + "=";
  for (const std::string& var : request.env) {
    if (var.rfind(parent, 0) != 0) env.push_back(var);
  }
  env.push_back(parent + std::to_string(::getppid()));
  return env;
}

// Returns the rank's environment in a child just forked, std::nullopt in the server.
std::optional<std::vector<std::string>> handle_request(Channel& channel, const Message& request,
                                                       std::vector<UniqueFd>& fds,
                                                       const ForkHooks& hooks) {
  if (request.kind == Message::kRelease) {
    kill_and_reap(channel);
    send_message(channel.socket.get(), Message{.kind = Message::kReleased});
    return std::nullopt;
  }
  if (request.kind != Message::kSpawn) return std::nullopt;
  if (hooks.prepare) {
    const std::string name = std::string(kForkServerImportsVar) + "=";
    for (const std::string& var : request.env) {
      if (var.rfind(name, 0) != 0) continue;
      std::vector<std::string> modules;
      std::stringstream names(var.substr(name.size()));
      for (std::string module; std::getline(names, module, ',');) {
        if (!module.empty()) modules.push_back(module);
      }
      hooks.prepare(modules);
    }
  }
  Message reply;
  if (fds.size() != 2) {
    reply = Message{.kind = Message::kError,
                    .text = "sgpu fork server: a spawn request without its stdout and stderr"};
  } else if (const int threads = thread_count(); threads > 1) {
    reply = Message{.kind = Message::kError,
                    .text = "sgpu fork server: it has " + std::to_string(threads) + " threads (" +
                            hooks.threads_hint + "), so forking it is unsafe. " + hooks.exec_hint};
  } else {
    if (hooks.before_fork) hooks.before_fork();
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (hooks.after_fork_child) hooks.after_fork_child();
      return become_rank(request, fds);
    }
    if (hooks.after_fork_parent) hooks.after_fork_parent();
    if (pid < 0) {
      reply =
          Message{.kind = Message::kError,
                  .text = std::string("sgpu fork server: fork failed: ") + std::strerror(errno)};
    } else {
      ::setpgid(pid, pid);  // also here, so the group exists before the caller can signal it
      channel.children.push_back(Child{pid, open_exit_fd(pid), false});
      reply = Message{.kind = Message::kSpawned, .pid = pid};
    }
  }
  send_message(channel.socket.get(), reply);
  return std::nullopt;
}

[[noreturn]] void shut_down(std::vector<Channel>& channels) {
  for (Channel& channel : channels) kill_and_reap(channel);
  ::_exit(0);
}

}  // namespace

std::unique_ptr<RankStarter> make_fork_server_starter() {
  return std::make_unique<ForkServerStarter>(own_server_command());
}

std::unique_ptr<RankStarter> make_fork_server_starter(const std::vector<std::string>& command) {
  return std::make_unique<ForkServerStarter>(command);
}

std::unique_ptr<RankStarter> make_starter(StartMethod method) {
  return method == StartMethod::kExec ? make_exec_starter() : make_fork_server_starter();
}

pid_t fork_server_pid() { return ServerHandle::instance(own_server_command()).pid(); }

pid_t fork_server_pid(const std::vector<std::string>& command) {
  return ServerHandle::instance(command).pid();
}

bool started_as_fork_server() { return rank::started_as(contract::kForkServerRole); }

void run_fork_server() {
  ForkHooks hooks;
  hooks.threads_hint = "a static initialiser of this program started them";
  hooks.exec_hint =
      "Use the exec start method: Options::start_method = sgpu::StartMethod::kExec, or "
      "SGPU_START_METHOD=exec";
  // The request's environment replaces the server's, as exec would.
  // Never freed: environ must stay valid through the exit handlers of every library.
  auto& strings = *new std::vector<std::string>(serve_forks(hooks));
  auto& pointers = *new std::vector<char*>;
  for (std::string& var : strings) pointers.push_back(var.data());
  pointers.push_back(nullptr);
  environ = pointers.data();
  rank::run_rank();
}

std::vector<std::string> serve_forks(const ForkHooks& hooks) {
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<Channel> channels;
  try {
    send_message(kControlFd, Message{.kind = Message::kHello, .pid = ::getpid()});
    while (true) {
      std::vector<pollfd> fds{{kControlFd, POLLIN, 0}};
      for (Channel& channel : channels) {
        fds.push_back({channel.socket.get(), POLLIN, 0});
        for (Child& child : channel.children) {
          if (!child.exit_reported) fds.push_back({child.exit_fd.get(), POLLIN, 0});
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) shut_down(channels);

      if (fds[0].revents != 0) {
        Message message;
        std::vector<UniqueFd> received;
        if (receive_message(kControlFd, message, &received, false) == Received::kClosed) {
          shut_down(channels);  // the caller is gone
        }
        if (message.kind == Message::kChannel && received.size() == 1) {
          channels.push_back(Channel{std::move(received[0]), {}});
        }
      }
      for (std::size_t i = 0; i < channels.size();) {
        Channel& channel = channels[i];
        Message message;
        std::vector<UniqueFd> received;
        const Received got = receive_message(channel.socket.get(), message, &received, false);
        if (got == Received::kClosed) {
          kill_and_reap(channel);
          channels.erase(channels.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        if (got == Received::kMessage) {
          if (auto env = handle_request(channel, message, received, hooks)) {
            // The new rank: the server's descriptors are closed already (become_rank),
            // so they are let go, not closed again.
            for (Channel& open : channels) {
              open.socket.release();
              for (Child& child : open.children) child.exit_fd.release();
            }
            return std::move(*env);
          }
        }
        for (Child& child : channel.children) {
          if (child.exit_reported) continue;
          const auto status = peek_exit(child.pid);
          if (!status) continue;
          child.exit_reported = true;
          child.exit_fd.reset();
          send_message(channel.socket.get(), Message{.kind = Message::kExited,
                                                     .pid = child.pid,
                                                     .exit_code = status->exit_code.value_or(-1),
                                                     .signal = status->signal.value_or(0)});
        }
        ++i;
      }
    }
  } catch (const std::exception& e) {
    const std::string text = std::string("sgpu fork server: ") + e.what() + "\n";
    [[maybe_unused]] ssize_t n = ::write(2, text.data(), text.size());
    shut_down(channels);
  }
}

}  // namespace sgpu::launcher
