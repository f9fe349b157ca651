// The rank's side of a call, entered from sgpu::init in a process started as a rank.
//
// Watches the caller's lifeline (end-of-file: the caller is gone, so the rank's whole
// process group is killed), reports crashes with a backtrace on stderr, binds the device,
// runs the staged function and writes rank-<N>/result.bin or rank-<N>/error.json.
#pragma once

namespace sgpu::launcher {

[[noreturn]] void run_rank();

// A program's rank (sgpu run): arms the parent-death signal, leaves the rank variables
// and drops sgpu's own, then becomes the program named by argv (found on PATH).
[[noreturn]] void run_program(char** argv);

}  // namespace sgpu::launcher
