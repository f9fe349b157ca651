#include "sgpu/process_group.h"

#include <mutex>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "contract/rank_env.h"
#include "rank/rank_group.h"
#include "rendezvous/peer_names.h"
#include "sgpu/errors.h"
#include "sgpu/runtime.h"

namespace sgpu {
c10d::Backend& process_group() {
  if (!is_rank()) {
    throw Error("sgpu::process_group() is for code running inside a distributed function");
  }
  static std::once_flag once;
  static c10::intrusive_ptr<c10d::Backend>* group = nullptr;  // lives to the rank's end
  std::call_once(once, [] {
    const contract::RankEnvironment env = contract::read_rank_environment();
    rendezvous::name_mapped_peers_as_ipv4();  // NOTE [Store peers' names]
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(env.master_port);
    store_options.isServer = false;
    store_options.timeout = env.group_timeout;
    rank::RankGroupRequest request;
    request.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    request.rank = env.rank;
    request.size = env.world_size;
    request.timeout = env.group_timeout;
    group = new c10::intrusive_ptr<c10d::Backend>(rank::make_rank_group(std::move(request)));
  });
  return **group;
}

}  // namespace sgpu
