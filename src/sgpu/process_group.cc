#include "sgpu/process_group.h"

#include <cstdlib>
#include <mutex>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backend/backend_table.h"
#include "launcher/program.h"
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
    const std::chrono::milliseconds timeout(launcher::env_int(
        launcher::kGroupTimeoutVar, std::chrono::milliseconds(std::chrono::minutes(30)).count()));
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(launcher::env_int("MASTER_PORT", 0));
    store_options.isServer = false;
    store_options.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(std::getenv("MASTER_ADDR"), store_options);
    backend::ProcessGroupRequest request;
    request.store = store;
    request.rank = global_rank();
    request.world_size = world_size();
    request.device_index = static_cast<int>(launcher::env_int(launcher::kDeviceVar, 0));
    request.timeout = timeout;
    const backend::Backend& chosen = backend::find_backend(std::getenv(launcher::kBackendVar));
    group = new c10::intrusive_ptr<c10d::Backend>(chosen.make_process_group(request));
  });
  return **group;
}

}  // namespace sgpu
