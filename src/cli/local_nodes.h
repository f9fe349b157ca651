// NOTE [Every node on one machine]
// `sgpu run --backend sim --nnodes N` with no node rank, no rendezvous endpoint or id, and
// no engine around it (torchrun's, Slurm's, Open MPI's or PMI's variables) simulates all N
// nodes on this machine. This sgpu is node 0; it starts one `sgpu run` for each other node,
// as a scheduler would, with the same flags and `--node-rank K --rdzv-endpoint
// 127.0.0.1:PORT` (a port free on the loopback when it looked). Each node is then a
// simulated node of its own (its own GPUs and their memory), and the launch is the one
// NOTE [Several nodes] describes: the ranks take torchrun's global places, collectives
// between nodes are timed on the platform's network (NOTE [The network between nodes]),
// and a failure on any node ends every node with its root cause. Each node prints its own
// ranks' output and its own figures' lines. The exit status is node 0's; when node 0
// succeeded, the first other node's that did not.
//
// A distributed function does the same within its caller's process (sgpu._decorator's
// _EveryNode): on the sim backend with no node rank, endpoint, id or engine, `nnodes` > 1,
// or `gpus` over the simulated node's GPUs (whole nodes of that size), starts each node's
// call side by side on one loopback endpoint. Node 0 gathers every rank's result; a node's
// launches are counted by launch id and node (node_link.cc), so that one process can be
// every node of a launch, again and again.
#pragma once

#include <functional>

#include "sgpu/options.h"

namespace sgpu::cli {

// Whether `options` (the environment's overrides applied) ask for every node here.
bool every_node_here(const Options& options);

// Runs the other nodes as `sgpu run`s started from this command line (`argc`, `argv`, its
// subcommand "run" among them) and node 0 through `run_node`, then waits for the others;
// what they leave running after node 0 ends is ended. Returns the exit status.
int run_every_node(Options options, int argc, char** argv,
                   const std::function<int(const Options&)>& run_node);

}  // namespace sgpu::cli
