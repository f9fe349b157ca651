// The program that ranks run: this binary, with the arguments main() received.
//
// Ranks re-execute the caller's binary, so sgpu::init(argc, argv) records argv here, and
// functions are named by where their code lives inside the loaded modules.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "contract/rank_env.h"
#include "sgpu/internal/call_record.h"

namespace sgpu::rank {

void set_program_args(int argc, char** argv);
// Empty until sgpu::init ran.
const std::vector<std::string>& program_args();

// True when this process was started in `role` (SGPU_ROLE says so; NOTE [The rank
// environment] in contract/rank_env.h).
bool started_as(std::string_view role);
// started_as(contract::kRankRole).
bool started_as_rank();

serialize::CodeAddress locate_code(const void* address);
// The address in this process of code located by locate_code in another process of the
// same binary. Throws std::runtime_error when the module is not loaded here.
void* resolve_code(const serialize::CodeAddress& address);
// The function's demangled name, from the dynamic symbols or else the module's own
// symbol table (static functions, anonymous namespaces); "" when the binary keeps none.
std::string code_name(const void* address);
// A function's plain name, for run names: "hello_world" for "hello_world(std::string)",
// "train" for "(anonymous namespace)::train(Job)", "step" for "int ns::step<int>(int)",
// "main lambda" for a lambda in main.
std::string plain_name(const std::string& function_name);
// A program's name, for run names: its base name, or for an interpreter the script's
// ("python train.py" is train.py, "python -m pkg.run" is pkg.run).
std::string program_run_name(const std::vector<std::string>& command);

}  // namespace sgpu::rank
