#include "parallel/group.h"

#include <mutex>
#include <string>

#include "sgpu/process_group.h"
#include "sgpu/runtime.h"

namespace sgpu::parallel {

c10::intrusive_ptr<c10d::ProcessGroup> default_group() {
  static std::once_flag once;
  static c10::intrusive_ptr<c10d::ProcessGroup>* group = nullptr;  // lives to the rank's end
  c10d::Backend& backend = process_group();                        // throws outside a rank
  std::call_once(once, [&backend] {
    auto owned = c10::intrusive_ptr<c10d::Backend>::unsafe_reclaim_from_nonowning(&backend);
    auto made = c10::make_intrusive<c10d::ProcessGroup>(global_rank(), world_size());
    const bool nccl = backend.getBackendName() == "nccl";
    const auto type =
        nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
    made->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type, owned);
    made->setDefaultBackend(type);
    group = new c10::intrusive_ptr<c10d::ProcessGroup>(std::move(made));
  });
  return *group;
}

std::string describe_rank(const c10d::ProcessGroup& group) {
  return "rank " + std::to_string(group.getRank()) + " of " + std::to_string(group.getSize());
}

}  // namespace sgpu::parallel
