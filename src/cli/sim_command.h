// `sgpu sim [--node SPEC] [--faults PLAN] -- COMMAND ARGS...`: COMMAND, and every process it
// starts, on a simulated node. A Python process of the tree that imports torch sees the
// node's GPUs as its cuda devices, as a process on that node sees them (NOTE [CUDA on sim]):
// pytest and its workers, mp.spawn's children, the ranks torchrun or accelerate launch
// starts; the calls of distributed functions they make run on the node too.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace sgpu::cli {

// Adds the subcommand to `app`; the function returned runs it once parsed: it does not
// return when COMMAND starts (the process becomes COMMAND), else it returns the exit status
// (2 for a bad node spec or fault plan, 127 for a command that cannot start).
std::function<int()> add_sim_command(CLI::App& app);

}  // namespace sgpu::cli
