// NOTE [Stack dumps]
// When a call hangs (or times out, or fails with ranks left in a collective) the caller
// takes every live rank's stacks without stopping the call for long: it sends
// native_stack_signal() to each thread of the rank (tgkill), and each thread's handler
// writes the return addresses of its own stack, one hexadecimal number a line, to
// rank-N/stacks/<tid> (written as <tid>.part and renamed, so a file that exists is whole).
// The caller turns the addresses into function names from the rank's /proc/<pid>/maps and
// the modules' symbol tables (launcher/stacks.h). A Python rank also has faulthandler
// write every Python thread's traceback to rank-N/stacks/python on python_stack_signal(),
// which the caller sends once, to the rank's main thread.
#pragma once

#include <filesystem>

namespace sgpu::contract {

int native_stack_signal();  // SIGRTMIN + 4
int python_stack_signal();  // SIGRTMIN + 5

// rank-N/stacks/
std::filesystem::path stacks_dir(const std::filesystem::path& rank_dir);
// rank-N/stacks/program.pid: in a `sgpu run` rank, the program's pid, written once the
// program (a Python one that imports sgpu) has armed its dumps; the caller then asks it,
// not its supervisor.
std::filesystem::path program_pid_file(const std::filesystem::path& rank_dir);
// rank-N/stacks/python: a Python process's tracebacks on the Python signal (its faulthandler).
std::filesystem::path python_stacks_file(const std::filesystem::path& rank_dir);

// In the rank, once, before anything can hang: creates the folder and installs the
// handler. Does nothing for an empty rank folder.
void arm_stack_dump(const std::filesystem::path& rank_dir);

}  // namespace sgpu::contract
