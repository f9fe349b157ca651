// What the tracking tests need around MLflow itself: a real tracking server (SQLite in a
// temp folder, 127.0.0.1, a free port, its own process group, stopped at the end), a
// reader that answers through MLflow's Python client (mlflow_reader.py, started once),
// and a TCP relay in front of the server that can be stopped and started again, so a
// test can take the server away from the ranks mid-run without paying MLflow's start-up
// (near a minute on a busy 2-core machine) twice.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "testing/temp_dir.h"

extern char** environ;

namespace sgpu::testing {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A child process in its own process group, with optional pipes to its stdin/stdout.
class Child {
 public:
  Child(std::vector<std::string> args, std::vector<std::string> extra_env, bool piped,
        const std::filesystem::path& log) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_text;
    for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
    for (auto& e : extra_env) env_text.push_back(e);
    std::vector<char*> env;
    for (auto& e : env_text) env.push_back(e.data());
    env.push_back(nullptr);
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (piped) {
      if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
        throw std::runtime_error("pipe");
      posix_spawn_file_actions_adddup2(&actions, in[0], 0);
      posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    }
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (!piped) posix_spawn_file_actions_adddup2(&actions, 2, 1);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    if (::posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), env.data()) != 0) {
      throw std::runtime_error("cannot start " + args[0]);
    }
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    if (piped) {
      ::close(in[0]);
      ::close(out[1]);
      to_ = ::fdopen(in[1], "w");
      from_ = ::fdopen(out[0], "r");
    }
  }
  ~Child() {
    if (to_ != nullptr) std::fclose(to_);
    if (from_ != nullptr) std::fclose(from_);
    ::kill(-pid_, SIGTERM);
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, WNOHANG);
  }
  std::string read_line() {
    std::string line;
    for (int c; (c = std::fgetc(from_)) != EOF && c != '\n';) line += static_cast<char>(c);
    return line;
  }
  void write_line(const std::string& line) {
    std::fputs((line + "\n").c_str(), to_);
    std::fflush(to_);
  }
  bool running() { return ::waitpid(pid_, nullptr, WNOHANG) == 0; }

 private:
  pid_t pid_ = 0;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

inline bool http_ok(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, request.data(), request.size()) > 0) {
      char buffer[64] = {0};
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 2000) > 0 && ::read(fd, buffer, sizeof buffer - 1) > 0) {
        ok = std::string(buffer).find(" 200 ") != std::string::npos;
      }
    }
  }
  ::close(fd);
  return ok;
}

class MlflowServer {
 public:
  explicit MlflowServer(const std::string& python)
      : dir_(make_temp_dir("sgpu-mlflow")), port_(free_port()) {
    server_ = std::make_unique<Child>(
        std::vector<std::string>{python, "-m", "mlflow", "server", "--backend-store-uri",
                                 "sqlite:///" + (dir_ / "mlflow.db").string(),
                                 "--default-artifact-root",
                                 "file://" + (dir_ / "artifacts").string(), "--host", "127.0.0.1",
                                 "--port", std::to_string(port_), "--workers", "1"},
        std::vector<std::string>{}, false, dir_ / "server.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(4);
    while (!http_ok(port_)) {
      if (!server_->running() || std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("the MLflow server did not start; see " +
                                 (dir_ / "server.log").string());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  ~MlflowServer() {
    server_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  int port() const { return port_; }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  std::filesystem::path dir_;
  int port_;
  std::unique_ptr<Child> server_;
};

class MlflowReader {
 public:
  MlflowReader(const std::string& python, const std::string& script)
      : log_(make_temp_dir("sgpu-reader") / "reader.log"),
        child_({python, script}, {"MLFLOW_ALLOW_FILE_STORE=true"}, true, log_) {
    const std::string ready = child_.read_line();
    if (ready.find("ready") == std::string::npos) {
      throw std::runtime_error("mlflow_reader.py did not start; see " + log_.string());
    }
  }
  nlohmann::json ask(const nlohmann::json& request) {
    std::lock_guard lock(mutex_);
    child_.write_line(request.dump());
    const nlohmann::json answer = nlohmann::json::parse(child_.read_line());
    if (answer.contains("error")) throw std::runtime_error(answer["error"].get<std::string>());
    return answer["ok"];
  }

 private:
  std::filesystem::path log_;
  Child child_;
  std::mutex mutex_;
};

// Relays 127.0.0.1:port() to a server port; stop() closes the listener and every open
// connection (clients then see "connection refused"), start() listens again on the
// same port.
class TcpRelay {
 public:
  explicit TcpRelay(int target) : target_(target), port_(free_port()) { start(); }
  ~TcpRelay() { stop(); }
  int port() const { return port_; }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }

  void start() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener_, 64) != 0) {
      throw std::runtime_error("relay cannot listen on " + std::to_string(port_));
    }
    running_ = true;
    thread_ = std::thread([this] { loop(); });
  }

  void stop() {
    if (!running_) return;
    running_ = false;
    thread_.join();
    ::close(listener_);
  }

 private:
  void loop() {
    std::vector<std::pair<int, int>> pairs;  // client, server
    while (running_) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (auto [c, s] : pairs) {
        fds.push_back({c, POLLIN, 0});
        fds.push_back({s, POLLIN, 0});
      }
      ::poll(fds.data(), fds.size(), 50);
      if (fds[0].revents & POLLIN) {
        const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<std::uint16_t>(target_));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (client >= 0 &&
            ::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
          pairs.emplace_back(client, server);
        } else {
          if (client >= 0) ::close(client);
          ::close(server);
        }
        continue;
      }
      std::vector<std::pair<int, int>> kept;
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        bool open = true;
        for (int side = 0; side < 2 && open; ++side) {
          const pollfd& p = fds[1 + 2 * i + static_cast<std::size_t>(side)];
          if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
          char buffer[65536];
          const ssize_t n = ::read(p.fd, buffer, sizeof buffer);
          const int other = side == 0 ? pairs[i].second : pairs[i].first;
          if (n <= 0 || ::write(other, buffer, static_cast<std::size_t>(n)) != n) open = false;
        }
        if (open) {
          kept.push_back(pairs[i]);
        } else {
          ::close(pairs[i].first);
          ::close(pairs[i].second);
        }
      }
      pairs = std::move(kept);
    }
    for (auto [c, s] : pairs) {
      ::close(c);
      ::close(s);
    }
  }

  int target_;
  int port_;
  int listener_ = -1;
  std::atomic<bool> running_{false};
  std::thread thread_;
};

}  // namespace sgpu::testing
