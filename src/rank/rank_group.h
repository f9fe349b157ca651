// The rank's process group, as the call's backend makes it (Gloo with the fault plan on
// sim, NCCL on cuda) with its collectives recorded in the rank's ring: one factory for a
// C++ function's rank (sgpu::process_group()) and for torch's "sgpu" backend in a Python
// rank (its creator, in the native module).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace sgpu::rank {

struct RankGroupRequest {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;  // in the group
  int size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  // The group's members, by group rank, as global ranks; empty: the world. The ring names a
  // group of fewer than every rank by them ("ranks 0,2").
  std::vector<int> members;
  // The group is torch's "nccl" (a Python rank's, on sim): it refuses what NCCL refuses.
  bool as_nccl = false;
  // The backend, in a process on a simulated node that sgpu did not start ("sim": one under
  // `sgpu sim`, say); empty in a rank, whose environment names it.
  std::string backend;
};

// In a rank that sgpu started (its environment names the backend and the device), or in a
// process on a simulated node (`request.backend`): there its world (a group of all ranks)
// and that world's subgroups are recorded in the node's folder under `sgpu sim`, and
// nowhere else (NOTE [A node's worlds] in launcher/node_watch.h).
c10::intrusive_ptr<c10d::Backend> make_rank_group(RankGroupRequest request);

// In a process on a simulated node under `sgpu sim`: its rank's folder in the world it
// joined last, where its stacks are dumped; empty when none was made.
std::filesystem::path node_world_rank_dir();

}  // namespace sgpu::rank
