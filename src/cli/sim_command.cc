#include "cli/sim_command.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "backend/backend_table.h"
#include "cli/run_flags.h"
#include "contract/node_memory.h"
#include "contract/option_table.h"
#include "contract/process_tree.h"
#include "contract/rank_env.h"
#include "launcher/launcher.h"
#include "launcher/node_watch.h"
#include "launcher/process.h"
#include "sgpu/errors.h"
#include "sgpu/options.h"

namespace sgpu::cli {
namespace {

struct SimFlags {
  std::string node;
  std::string faults;
  std::string hang_timeout;
  std::vector<std::string> command;
};

constexpr int kSimUsageError = 2;
constexpr int kSimCannotStart = 127;
constexpr int kSimHung = 124;       // as sgpu run's hang
constexpr int kAnyWorld = 1 << 20;  // ranks a fault plan may name
constexpr auto kLeftBehindGrace = std::chrono::seconds(2);
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};  // and SIGCHLD, to wake

// The variables that put a process tree on the node: what a process that starts with them
// serves as its cuda devices, what its calls of distributed functions run on, and where the
// worlds its processes form are recorded (NOTE [A node's worlds]). Throws ConfigError.
Options node_environment(const SimFlags& flags) {
  if (!flags.node.empty()) ::setenv("SGPU_SIM", flags.node.c_str(), 1);
  if (!flags.faults.empty()) ::setenv("SGPU_SIM_FAULTS", flags.faults.c_str(), 1);
  if (!flags.hang_timeout.empty()) ::setenv("SGPU_HANG_TIMEOUT", flags.hang_timeout.c_str(), 1);
  ::setenv("SGPU_BACKEND", contract::kSimBackend, 1);
  // Every SGPU_* variable checked.
  Options options = contract::with_environment(command_options());
  // The node spec parsed, the plan checked (its ranks are the worlds', which may have any
  // number); a world's collectives are predicted on the node's platform, as a call's are.
  Options checked = options;
  checked.gpus = kAnyWorld;
  checked.nnodes = 1;
  for (const std::string& variable :
       backend::find_backend(contract::kSimBackend).rank_environment(checked)) {
    const std::string name = variable.substr(0, variable.find('='));
    if (name == contract::kPlatformVar)
      ::setenv(name.c_str(), variable.c_str() + name.size() + 1, 0);
  }
  ::setenv(contract::kRecorderEntriesVar, std::to_string(options.recorder_entries).c_str(), 1);
  return options;
}

// <runs dir>/node-<pid>/, made for this run of the command; empty when it cannot be.
std::filesystem::path make_node_folder(const Options& options) {
  const std::filesystem::path dir =
      launcher::runs_dir(options) / ("node-" + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || ::chmod(dir.c_str(), 0700) != 0) {
    std::cerr << "sgpu sim: cannot make the node's folder " << dir.string()
              << ": the groups its processes form are not watched for hangs" << std::endl;
    return {};
  }
  ::setenv(contract::kNodeDirVar, dir.c_str(), 1);
  return dir;
}

// The command, as this process's child, with the signal state it would have had.
pid_t start_command(const std::vector<std::string>& command, const sigset_t& original) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::sigprocmask(SIG_SETMASK, &original, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // it ends with sgpu sim, whatever ends that
  if (::getppid() != parent) ::_exit(kSimCannotStart);
  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::cerr << "sgpu sim: cannot run " << command[0] << ": " << std::strerror(errno) << std::endl;
  ::_exit(kSimCannotStart);
}

// Reaps every exited child (the command, and what this subreaper adopted); the command's
// wait status once it ended.
void reap_children(pid_t command, std::optional<int>& status) {
  int wstatus = 0;
  for (pid_t pid; (pid = ::waitpid(-1, &wstatus, WNOHANG)) > 0;) {
    if (pid == command) status = wstatus;
  }
}

// A signal sent to sgpu sim goes on to the command; one the terminal sent (Ctrl-C) reached
// the command itself, as it is in the terminal's foreground group too.
void forward_signals(int signal_fd, pid_t command) {
  signalfd_siginfo info{};
  while (::read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    if (info.ssi_signo == SIGCHLD || info.ssi_code == SI_KERNEL) continue;
    ::kill(command, static_cast<int>(info.ssi_signo));
  }
}

// What the command left running when it ended: a moment to end by itself (multiprocessing's
// resource tracker ends once its users have), then ended, as a launch's final sweep ends it.
void end_what_is_left() {
  const auto until = std::chrono::steady_clock::now() + kLeftBehindGrace;
  std::vector<pid_t> left;
  int status = 0;
  while (!(left = contract::children_of_this_process()).empty() &&
         std::chrono::steady_clock::now() < until) {
    while (::waitpid(-1, &status, WNOHANG) > 0) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (left.empty()) return;
  std::cerr << "sgpu sim: ending " << left.size() << " process" << (left.size() == 1 ? "" : "es")
            << " the command left running (";
  for (std::size_t i = 0; i < left.size(); ++i) std::cerr << (i == 0 ? "pid " : ", ") << left[i];
  std::cerr << ")" << std::endl;
  contract::kill_descendants(::getpid());
  while (::waitpid(-1, &status, 0) > 0 || errno == EINTR) {
  }
}

// Runs the command and watches the worlds its processes form until it ends.
int supervise(const SimFlags& flags, const Options& options, const std::filesystem::path& dir) {
  sigset_t forwarded, original;
  ::sigemptyset(&forwarded);
  for (int signal : kForwarded) ::sigaddset(&forwarded, signal);
  ::sigaddset(&forwarded, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &forwarded, &original);
  const launcher::UniqueFd signal_fd(::signalfd(-1, &forwarded, SFD_NONBLOCK | SFD_CLOEXEC));
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t command = start_command(flags.command, original);
  if (command < 0) {
    std::cerr << "sgpu sim: cannot start " << flags.command[0] << ": " << std::strerror(errno)
              << std::endl;
    return kSimCannotStart;
  }
  launcher::NodeWatch watch({dir, options.hang_timeout, options.teardown_grace, options.front_end});
  std::optional<int> status;
  while (!status) {
    pollfd fd{signal_fd.get(), POLLIN, 0};
    ::poll(&fd, 1, static_cast<int>(watch.period().count()));
    forward_signals(signal_fd.get(), command);
    reap_children(command, status);
    if (!dir.empty()) watch.check(std::cerr);
  }
  end_what_is_left();
  if (!dir.empty()) {
    watch.finish(std::cerr);
    std::error_code ec;
    if (!watch.hung() && !options.keep_run_dir) std::filesystem::remove_all(dir, ec);
  }
  return watch.hung() ? kSimHung : launcher::shell_status(*status);
}

int run_sim(const SimFlags& flags) {
  Options options;
  try {
    options = node_environment(flags);
  } catch (const Error& e) {
    std::cerr << "sgpu sim: " << e.what() << std::endl;
    return kSimUsageError;
  }
  // The node's ledger of device memory, which every process of the tree shares (NOTE [A
  // node's shared device memory]); its fd stays open here, for as long as the command runs.
  if (!contract::NodeMemory::make_for_process()) {
    std::cerr << "sgpu sim: cannot make the node's memory ledger (" << std::strerror(errno)
              << "): each process counts its own device memory" << std::endl;
  }
  const std::filesystem::path dir =
      options.recorder_entries == 0 ? std::filesystem::path() : make_node_folder(options);
  return supervise(flags, options, dir);
}

}  // namespace

std::function<int()> add_sim_command(CLI::App& app) {
  auto flags = std::make_shared<SimFlags>();
  CLI::App* sim = app.add_subcommand(
      "sim",
      "Run a command, and everything it starts, on a simulated node: each Python process "
      "that imports torch sees the node's GPUs as its cuda devices");
  sim->add_option("--node", flags->node,
                  "The simulated node, a spec such as 8xH100 or 4xH100+4xA10 (default: "
                  "SGPU_SIM, else 8xH100)");
  sim->add_option("--faults", flags->faults,
                  "A fault plan for the process groups formed under it and the calls made "
                  "under it, as SGPU_SIM_FAULTS takes it");
  sim->add_option("--hang-timeout", flags->hang_timeout,
                  "Seconds a collective may be in flight before its world is judged hung and "
                  "its processes ended, or none (default: SGPU_HANG_TIMEOUT, else 600)");
  sim->add_option("command", flags->command, "The command and its arguments, after --")->required();
  sim->footer(
      "Examples:\n"
      "  sgpu sim -- pytest tests/\n"
      "  sgpu sim --node 4xA10 -- torchrun --nproc-per-node 4 train.py\n"
      "  sgpu sim -- jupyter lab");
  return [flags] { return run_sim(*flags); };
}

}  // namespace sgpu::cli
