// The program that ranks run: this binary, with the arguments main() received.
//
// Ranks re-execute the caller's binary, so sgpu::init(argc, argv) records argv here, and
// functions are named by where their code lives inside the loaded modules.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "serialize/call_record.h"

namespace sgpu::launcher {

void set_program_args(int argc, char** argv);
// Empty until sgpu::init ran.
const std::vector<std::string>& program_args();

// The environment variable names sgpu sets for ranks, besides the torchrun ones.
inline constexpr const char* kRoleVar = "SGPU_ROLE";                      // "rank"
inline constexpr const char* kCallFileVar = "SGPU_CALL_FILE";             // the staged call.bin
inline constexpr const char* kRankDirVar = "SGPU_RANK_DIR";               // rank-<N>/
inline constexpr const char* kDeviceVar = "SGPU_DEVICE_INDEX";            // device to bind
inline constexpr const char* kBackendVar = "SGPU_RANK_BACKEND";           // resolved backend name
inline constexpr const char* kParentVar = "SGPU_PARENT_PID";              // expected parent
inline constexpr const char* kLifelineVar = "SGPU_LIFELINE_FD";           // lifeline read end
inline constexpr const char* kGroupTimeoutVar = "SGPU_GROUP_TIMEOUT_MS";  // collectives

// The integer in environment variable `name`, or `fallback` when it is unset or empty.
long long env_int(const char* name, long long fallback);

// True when this process was started in `role` (SGPU_ROLE says so).
bool started_as(std::string_view role);
// started_as("rank").
bool started_as_rank();

serialize::CodeAddress locate_code(const void* address);
// The address in this process of code located by locate_code in another process of the
// same binary. Throws std::runtime_error when the module is not loaded here.
void* resolve_code(const serialize::CodeAddress& address);
std::string code_name(const void* address);

}  // namespace sgpu::launcher
