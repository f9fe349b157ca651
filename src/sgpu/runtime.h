// The process-wide runtime: sgpu::init and the helpers user code calls inside a rank.
//
// sgpu starts every rank by running the caller's own binary again, so main() must begin
// with sgpu::init(argc, argv), as with MPI_Init. In the caller init records argv and
// returns. In a rank process it binds the rank to its device, runs the rank's function,
// writes its result or error record, and exits: it never returns there. In a fork server
// (see src/launcher/fork_server.h) it serves fork requests until the caller goes away.
#pragma once

#include <string>

namespace sgpu {

void init(int argc, char** argv);

// True in a rank process (after init), false in the caller.
bool is_rank();

// The rank variables, as torchrun sets them. Outside a rank: rank 0 of a world of 1.
int global_rank();
int local_rank();
int world_size();
int local_world_size();
int node_rank();

// The name of the device this rank is bound to: "cuda:<n>" on cuda, "cpu" on sim.
std::string device();

}  // namespace sgpu
