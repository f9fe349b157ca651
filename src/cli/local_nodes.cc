#include "cli/local_nodes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "launcher/process.h"
#include "nodes/nodes.h"
#include "sgpu/errors.h"

extern char** environ;

namespace sgpu::cli {
namespace {

// A port nothing listens on at 127.0.0.1 now (the kernel's pick for port 0).
std::uint16_t free_loopback_port() {
  const launcher::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0)
    throw Error(std::string("no free port on 127.0.0.1 for the nodes' store: ") +
                std::strerror(errno));
  return ntohs(address.sin_port);
}

struct Node {
  int rank = 0;
  pid_t pid = -1;
  int status = -1;  // its exit status once reaped
};

// Waits up to `limit` for every node not yet reaped.
void reap(std::vector<Node>& nodes, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool waiting = false;
    for (Node& node : nodes) {
      if (node.status >= 0) continue;
      int wait_status = 0;
      const pid_t got = ::waitpid(node.pid, &wait_status, WNOHANG);
      if (got == node.pid) {
        node.status = launcher::shell_status(wait_status);
      } else if (got < 0) {
        node.status = 1;  // not ours to wait for any more
      } else {
        waiting = true;
      }
    }
    if (!waiting || std::chrono::steady_clock::now() >= until) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Ends the nodes still running: SIGTERM, a grace, SIGKILL, each named.
void end_the_rest(std::vector<Node>& nodes) {
  for (int signal : {SIGTERM, SIGKILL}) {
    bool any = false;
    for (const Node& node : nodes) {
      if (node.status >= 0) continue;
      any = true;
      std::cerr << "sgpu run: node " << node.rank << " (pid " << node.pid
                << ") still runs after node 0 ended; sending it "
                << (signal == SIGTERM ? "SIGTERM" : "SIGKILL") << std::endl;
      ::kill(node.pid, signal);
    }
    if (!any) return;
    reap(nodes, std::chrono::seconds(signal == SIGTERM ? 10 : 60));
  }
}

}  // namespace

bool every_node_here(const Options& options) {
  // A folded world is one launch (NOTE [A folded world]).
  return options.nnodes > 1 && nodes::nodes_may_be_here(options) && !options.sim.fold;
}

int run_every_node(Options options, int argc, char** argv,
                   const std::function<int(const Options&)>& run_node) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(free_loopback_port());
  int subcommand = 1;
  while (subcommand < argc && std::string(argv[subcommand]) != "run") ++subcommand;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::vector<Node> nodes;
  for (int rank = 1; rank < options.nnodes; ++rank) {
    launcher::SpawnRequest request;
    request.program = std::filesystem::read_symlink("/proc/self/exe").string();
    for (int i = 0; i < argc; ++i) {
      request.argv.emplace_back(argv[i]);
      if (i == subcommand)
        request.argv.insert(request.argv.end(),
                            {"--node-rank", std::to_string(rank), "--rdzv-endpoint", endpoint});
    }
    request.env = env;
    request.stdout_fd = STDOUT_FILENO;
    request.stderr_fd = STDERR_FILENO;
    request.new_process_group = false;  // a terminal's Ctrl-C reaches every node
    try {
      nodes.push_back({rank, launcher::spawn_process(request)});
    } catch (const std::system_error& e) {
      end_the_rest(nodes);
      throw Error("could not start node " + std::to_string(rank) + " of " +
                  std::to_string(options.nnodes) + ": " + e.what());
    }
  }
  options.node_rank = 0;
  options.rdzv_endpoint = endpoint;
  const int status = run_node(options);
  // Node 0 ends the launch; the others end with it (NOTE [Several nodes]).
  reap(nodes, std::chrono::seconds(60));
  end_the_rest(nodes);
  if (status != 0) return status;
  for (const Node& node : nodes)
    if (node.status != 0) return node.status;
  return 0;
}

}  // namespace sgpu::cli
