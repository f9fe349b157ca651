// NOTE [Several nodes]
// A launch over several nodes is the same launch started once per node (by hand, by a
// scheduler that drives torchrun, by `srun --ntasks-per-node=1` or `mpirun -npernode 1`),
// each with its own node rank. plan_nodes() works out this node's place: the options
// (sgpu run's flags) first, then the engine the process runs under, else one node.
//   torchrun's variables  PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT
//                         (what Kubeflow's trainer sets), PET_RDZV_ID
//   Slurm (inside srun)   SLURM_STEP_NUM_NODES, this node's place in SLURM_STEP_NODELIST
//                         (SLURMD_NODENAME; else SLURM_NODEID), node 0 the list's first
//                         host, the port MASTER_PORT or derived from the job and step ids
//   Open MPI              OMPI_COMM_WORLD_SIZE / _RANK (one process per node), node 0 at
//                         MASTER_ADDR, else the address of mpirun's own daemon, the port
//                         MASTER_PORT or derived from the job id; ahead of Slurm's
//                         variables, which mpirun's daemons carry under Slurm
//   PMI (MPICH, Intel)    PMI_SIZE / PMI_RANK, node 0 at MASTER_ADDR
// An explicit node count or rank that contradicts the engine is a ConfigError; an explicit
// endpoint or id is used as given. Node 0 hosts the launch's store on HOST's address
// (nodes/node_link.h says what the nodes tell each other there).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sgpu/options.h"

namespace sgpu::nodes {

inline constexpr std::uint16_t kDefaultRdzvPort = 29500;  // torchrun's

struct NodePlan {
  int nnodes = 1;
  int node_rank = 0;
  std::string host;  // node 0's host as the other nodes reach it; empty for one node
  std::uint16_t port = 0;
  std::string id;      // the launch's rendezvous id
  std::string engine;  // what said so: "flags", "torchrun (PET_*)", "Slurm", "Open MPI", "PMI";
                       // empty for one node and nothing detected
  FrontEnd front_end = FrontEnd::kCpp;  // how errors name the settings (Options::front_end)
  bool several() const { return nnodes > 1; }
  // "node 1 of 2, node 0 at n1:29500 (Slurm)", or "one node".
  std::string describe() const;
};

// An environment variable's value, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
std::optional<std::string> process_env(const char* name);

// This node's place (NOTE [Several nodes]). Throws ConfigError for bad or contradictory
// settings, naming the setting or the variable.
NodePlan plan_nodes(const Options& options, const EnvLookup& env = process_env);

// Whether a launch with `options` (the environment's overrides applied) may simulate its
// nodes on this machine (NOTE [Every node on one machine]): on the sim backend, with no node
// rank, rendezvous endpoint or id given, and no engine around it that says the node's place
// (torchrun's, Slurm's, Open MPI's or PMI's variables).
bool nodes_may_be_here(const Options& options, const EnvLookup& env = process_env);

// Whether a launch with `options` (the environment's overrides applied) runs its simulated
// nodes folded (NOTE [A folded world] in sim/fold.h): sim_fold, over several nodes that may
// be here; node 0's ranks run, standing for every node's. sim_fold where the nodes may not be
// here (another backend, a node rank, endpoint or id given, an engine around it) is a
// ConfigError: only a simulated world on one machine folds.
bool folds_nodes(const Options& options, const EnvLookup& env = process_env);

// Slurm's compressed host list, in order: "n[1-3,07],gpu-a" is n1 n2 n3 n07 gpu-a (a
// range keeps its first number's zero padding). Throws ConfigError on a malformed list.
std::vector<std::string> expand_hostlist(std::string_view list);

// "HOST:PORT", "HOST" (port `fallback`), "[v6]:PORT". Throws ConfigError naming `what`.
std::pair<std::string, std::uint16_t> parse_endpoint(std::string_view text, std::uint16_t fallback,
                                                     const std::string& what);

}  // namespace sgpu::nodes
