// The rank's side of a call, entered from sgpu::init in a process started as a rank.
//
// Watches the caller's lifeline (end-of-file: the caller is gone, so the rank's whole
// process group is killed), reports crashes with a backtrace on stderr, binds the device,
// runs the staged function and writes rank-<N>/result.bin or rank-<N>/error.json.
#pragma once

namespace sgpu::rank {

[[noreturn]] void run_rank();

// A worker rank's side (launcher.h, WorkerCall), for the worker program to call first:
// the same guards a function's rank has (the lifeline, the parent-death signal, crash
// backtraces on stderr, the rank logger's flush on SIGTERM, NOTE [Abrupt ends]).
void enter_worker_rank();

// In the program a `sgpu run` rank supervises, when it imports sgpu: its threads answer the
// caller's stack signal (NOTE [Stack dumps]) into its rank's folder.
void arm_program_stacks();
// In a Python program a `sgpu run` rank supervises, once it runs in shape-only compute
// (sgpu/_shapes.py): says so to its supervisor, which fails a program in shapes that never
// did (a C++ program, one that never imports torch) rather than let it compute values.
void enter_program_shapes();
// At such a program's end: its GPU's memory figures into rank-<N>/memory.json and its
// compute estimate into compute.json, for the caller's summary.
void record_program_figures();
// Ends a worker rank as a function's rank ends: the rank logger closed, output flushed,
// _exit(code).
[[noreturn]] void end_worker_rank(int code);

// Binds this rank's device (Backend::bind); a rank that did has its device's memory
// figures written to rank-<N>/memory.json and logged to the call's run as it ends.
void bind_rank_device();

// A program's rank (sgpu run): arms the parent-death signal, leaves the rank variables
// and drops sgpu's own, then becomes the program named by argv (found on PATH).
[[noreturn]] void run_program(char** argv);

}  // namespace sgpu::rank
