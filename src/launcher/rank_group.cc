#include "launcher/rank_group.h"

#include <string>
#include <utility>

#include "backend/backend_table.h"
#include "backend/process_group_factory.h"
#include "collectives/recorder.h"
#include "contract/collective_ring.h"
#include "contract/rank_env.h"

namespace sgpu::launcher {

c10::intrusive_ptr<c10d::Backend> make_rank_group(RankGroupRequest request) {
  const contract::RankEnvironment env = contract::read_rank_environment();
  contract::RingGroup recorded{"world", request.size, request.rank, std::move(request.members)};
  if (recorded.members.empty()) {
    for (int member = 0; member < request.size; ++member) recorded.members.push_back(member);
  } else if (static_cast<int>(recorded.members.size()) != env.world_size) {
    recorded.name = "ranks";
    for (std::size_t i = 0; i < recorded.members.size(); ++i) {
      recorded.name += (i == 0 ? " " : ",") + std::to_string(recorded.members[i]);
    }
  }
  backend::ProcessGroupRequest group;
  group.store = std::move(request.store);
  group.rank = request.rank;
  group.world_size = request.size;
  group.device_index = env.device_index;
  group.timeout = request.timeout;
  group.as_nccl = request.as_nccl;
  const std::string& name = env.backend.empty() ? request.backend : env.backend;
  group.record = collectives::recorder_for(std::move(recorded), collectives::completion_for(name));
  return backend::find_backend(name).process_groups().make(group);
}

}  // namespace sgpu::launcher
