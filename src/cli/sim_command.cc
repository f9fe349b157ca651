#include "cli/sim_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend_table.h"
#include "contract/node_memory.h"
#include "contract/option_table.h"
#include "sgpu/errors.h"
#include "sgpu/options.h"

namespace sgpu::cli {
namespace {

struct SimFlags {
  std::string node;
  std::string faults;
  std::vector<std::string> command;
};

constexpr int kSimUsageError = 2;
constexpr int kSimCannotStart = 127;

// The variables that put a process tree on the node: what a process that starts with them
// serves as its cuda devices, and what its calls of distributed functions run on.
int run_sim(const SimFlags& flags) {
  if (!flags.node.empty()) ::setenv("SGPU_SIM", flags.node.c_str(), 1);
  if (!flags.faults.empty()) ::setenv("SGPU_SIM_FAULTS", flags.faults.c_str(), 1);
  ::setenv("SGPU_BACKEND", "sim", 1);
  try {
    const Options options = contract::with_environment({});  // every SGPU_* variable checked
    (void)backend::find_backend("sim").inventory(options);   // the node spec parsed
  } catch (const Error& e) {
    std::cerr << "sgpu sim: " << e.what() << std::endl;
    return kSimUsageError;
  }
  // The node's ledger of device memory, which every process of the tree shares (NOTE [A
  // node's shared device memory]); its fd stays open in COMMAND, which this process becomes.
  if (!contract::NodeMemory::make_for_process()) {
    std::cerr << "sgpu sim: cannot make the node's memory ledger (" << std::strerror(errno)
              << "): each process counts its own device memory" << std::endl;
  }
  std::vector<char*> argv;
  for (const std::string& arg : flags.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::cerr << "sgpu sim: cannot run " << flags.command[0] << ": " << std::strerror(errno)
            << std::endl;
  return kSimCannotStart;
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
                  "A fault plan for the calls made under it, as SGPU_SIM_FAULTS takes it");
  sim->add_option("command", flags->command, "The command and its arguments, after --")->required();
  sim->footer(
      "Examples:\n"
      "  sgpu sim -- pytest tests/\n"
      "  sgpu sim --node 4xA10 -- torchrun --nproc-per-node 4 train.py\n"
      "  sgpu sim -- jupyter lab");
  return [flags] { return run_sim(*flags); };
}

}  // namespace sgpu::cli
