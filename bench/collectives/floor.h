// The floor of the collective benchmark: the same sweep (collective_sweep.h) in plain
// processes that use libtorch alone, with nothing of sgpu in between.
//
// run_floor hosts a c10d::TCPStore on 127.0.0.1, spawns this binary once per rank with
// the floor's variables set (and OMP_NUM_THREADS=1, as torchrun and sgpu set it), waits
// for every rank, and reads each rank's result from the store. A floor rank
// (floor_rank_main, called by main() before anything else when is_floor_rank()) connects
// to the store, makes its process group the way a user of libtorch would
// (ProcessGroupGloo with the default device on "sim"; on "cuda" it sets its device and
// makes a ProcessGroupNCCL through the two C entry points of the CUDA module, which do
// nothing else), runs the sweep and stores its result.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "collectives/collective_sweep.h"

namespace sgpu::bench {

bool is_floor_rank();
[[noreturn]] void floor_rank_main();

// One SweepResult per rank. Throws std::runtime_error naming the rank that failed, or the
// ranks still running at the deadline (they are killed).
std::vector<SweepResult> run_floor(const SweepSpec& spec, const std::string& backend,
                                   int world_size, std::chrono::milliseconds timeout);

}  // namespace sgpu::bench
