#include "rank/rank_group.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "backend/backend_table.h"
#include "backend/process_group_factory.h"
#include "collectives/recorder.h"
#include "contract/collective_ring.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "contract/stack_dump.h"

namespace sgpu::rank {
namespace {

// The world a process on a simulated node joined last (NOTE [A node's worlds] in
// launcher/node_watch.h): its subgroups are recorded in its ring.
struct NodeWorld {
  contract::CollectiveRing* ring = nullptr;
  int size = 1;
  std::filesystem::path rank_dir;
};
NodeWorld g_node_world;  // set while the world is formed, before any collective of it
std::atomic<int> g_worlds_formed{0};

// The world's name, agreed over its store: rank 0's pid and count. The key is counted by
// the joins the store has seen, so a store that forms a second world after the first
// hands out that world's name, never the first one's.
std::string agree_world_id(c10d::Store& store, int rank, int size) {
  const std::int64_t joins = store.add("sgpu/node-world-joins", 1);
  const std::string key = "sgpu/node-world/" + std::to_string((joins - 1) / size);
  if (rank != 0) {
    const std::vector<std::uint8_t> id = store.get(key);
    return {id.begin(), id.end()};
  }
  const std::string id = std::to_string(::getpid()) + "-" + std::to_string(++g_worlds_formed);
  store.set(key, std::vector<std::uint8_t>(id.begin(), id.end()));
  return id;
}

// A world formed by processes on the node under `sgpu sim` (SGPU_NODE_DIR): this process's
// place in it gets a ring and its stack dumps in the node's folder, which `sgpu sim`
// watches as a launch watches its ranks. Elsewhere nothing is recorded.
void join_node_world(c10d::Store& store, int rank, int size) {
  g_node_world = NodeWorld{nullptr, size, {}};
  const std::string node = contract::env_string(contract::kNodeDirVar);
  if (node.empty()) return;
  const contract::RankFolder folder =
      contract::NodeFolder{node}.world(agree_world_id(store, rank, size)).rank(rank);
  std::error_code ec;
  std::filesystem::create_directories(folder.dir, ec);
  if (ec) return;
  g_node_world.rank_dir = folder.dir;
  g_node_world.ring = collectives::world_ring(folder, rank, size);
  contract::arm_stack_dump(folder.dir);  // NOTE [Stack dumps]
}

// How the ring names a group: "world", or its members ("ranks 0,2") when fewer than all.
contract::RingGroup ring_group(int size, int rank, std::vector<int> members, int world_size) {
  contract::RingGroup recorded{"world", size, rank, std::move(members)};
  if (recorded.members.empty()) {
    for (int member = 0; member < size; ++member) recorded.members.push_back(member);
  } else if (static_cast<int>(recorded.members.size()) != world_size) {
    recorded.name = "ranks";
    for (std::size_t i = 0; i < recorded.members.size(); ++i) {
      recorded.name += (i == 0 ? " " : ",") + std::to_string(recorded.members[i]);
    }
  }
  return recorded;
}

}  // namespace

std::filesystem::path node_world_rank_dir() { return g_node_world.rank_dir; }

c10::intrusive_ptr<c10d::Backend> make_rank_group(RankGroupRequest request) {
  const contract::RankEnvironment env = contract::read_rank_environment();
  backend::ProcessGroupRequest group;
  const bool on_node = env.backend.empty() && !request.backend.empty();
  const bool world = request.members.empty();
  if (on_node && world) {
    join_node_world(*request.store, request.rank, request.size);
    group.node_world_rank = request.rank;
  }
  const int world_size = on_node ? g_node_world.size : env.world_size;
  group.members = request.members;
  contract::RingGroup recorded =
      ring_group(request.size, request.rank, std::move(request.members), world_size);
  group.store = std::move(request.store);
  group.rank = request.rank;
  group.world_size = request.size;
  group.device_index = env.device_index;
  group.timeout = request.timeout;
  group.as_nccl = request.as_nccl;
  const std::string& name = on_node ? request.backend : env.backend;
  const collectives::Completion completion = collectives::completion_for(name);
  if (on_node) {
    group.record = [ring = g_node_world.ring, recorded, completion](auto transport) {
      return collectives::record_collectives(std::move(transport), ring, recorded, completion);
    };
  } else {
    group.record = collectives::recorder_for(std::move(recorded), completion);
  }
  return backend::find_backend(name).process_groups().make(group);
}

}  // namespace sgpu::rank
