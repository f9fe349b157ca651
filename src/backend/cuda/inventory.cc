// Device detection through the CUDA driver API, loaded with dlopen.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend/cuda/cuda_backend.h"
#include "backend/gpu_type.h"
#include "backend/memory_stats.h"
#include "backend/process_group_factory.h"
#include "collectives/routes.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "model/platform.h"
#include "sgpu/errors.h"

namespace sgpu::cuda {
namespace {

struct Driver {
  void* handle = nullptr;
  decltype(&cuInit) init = nullptr;
  decltype(&cuDeviceGetCount) get_count = nullptr;
  decltype(&cuDeviceGet) get = nullptr;
  decltype(&cuDeviceGetName) get_name = nullptr;
  decltype(&cuDeviceTotalMem) total_mem = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;  // optional: capability, SMs
  decltype(&cuGetErrorString) error_string = nullptr;
  std::string load_error;
};

const Driver& driver() {
  static const Driver loaded = [] {
    Driver d;
    d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (d.handle == nullptr) {
      d.load_error = std::string("no CUDA driver (") + dlerror() + ")";
      return d;
    }
    d.init = reinterpret_cast<decltype(&cuInit)>(dlsym(d.handle, "cuInit"));
    d.get_count =
        reinterpret_cast<decltype(&cuDeviceGetCount)>(dlsym(d.handle, "cuDeviceGetCount"));
    d.get = reinterpret_cast<decltype(&cuDeviceGet)>(dlsym(d.handle, "cuDeviceGet"));
    d.get_name = reinterpret_cast<decltype(&cuDeviceGetName)>(dlsym(d.handle, "cuDeviceGetName"));
    d.total_mem =
        reinterpret_cast<decltype(&cuDeviceTotalMem)>(dlsym(d.handle, "cuDeviceTotalMem_v2"));
    d.attribute =
        reinterpret_cast<decltype(&cuDeviceGetAttribute)>(dlsym(d.handle, "cuDeviceGetAttribute"));
    d.error_string =
        reinterpret_cast<decltype(&cuGetErrorString)>(dlsym(d.handle, "cuGetErrorString"));
    if (!d.init || !d.get_count || !d.get || !d.get_name || !d.total_mem) {
      d.load_error = "the CUDA driver in libcuda.so.1 lacks the device API sgpu needs";
    }
    return d;
  }();
  return loaded;
}

std::string describe(const Driver& d, CUresult result) {
  const char* text = nullptr;
  if (d.error_string != nullptr) d.error_string(result, &text);
  return text != nullptr ? text : "CUDA error " + std::to_string(static_cast<int>(result));
}

}  // namespace

backend::Inventory CudaBackend::inventory(const Options&) const {
  backend::Inventory inventory;
  inventory.node = "this node's NVIDIA GPUs";
  const Driver& d = driver();
  if (!d.load_error.empty()) {
    inventory.unavailable_reason = d.load_error;
    return inventory;
  }
  if (CUresult r = d.init(0); r != CUDA_SUCCESS) {
    inventory.unavailable_reason = "the CUDA driver did not initialise: " + describe(d, r);
    return inventory;
  }
  int count = 0;
  if (CUresult r = d.get_count(&count); r != CUDA_SUCCESS || count == 0) {
    inventory.unavailable_reason =
        r != CUDA_SUCCESS ? "cannot count devices: " + describe(d, r)
                          : "the driver reports no device (check CUDA_VISIBLE_DEVICES)";
    return inventory;
  }
  for (int i = 0; i < count; ++i) {
    CUdevice device = 0;
    char name[256] = {};
    size_t memory = 0;
    if (d.get(&device, i) != CUDA_SUCCESS) continue;
    d.get_name(name, sizeof name, device);
    d.total_mem(&memory, device);
    backend::Gpu gpu;
    gpu.index = i;
    gpu.name = name;
    gpu.type = backend::normalize_device_name(gpu.name);
    gpu.memory_bytes = memory;
    if (d.attribute != nullptr) {
      d.attribute(&gpu.capability_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device);
      d.attribute(&gpu.capability_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device);
      d.attribute(&gpu.multi_processor_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
    }
    inventory.gpus.push_back(std::move(gpu));
  }
  return inventory;
}

namespace {

struct RuntimeModule {
  void (*bind)(int, double) = nullptr;
  void (*make_process_group)(const backend::ProcessGroupRequest*,
                             c10::intrusive_ptr<c10d::Backend>*) = nullptr;
  void (*memory_stats)(int, c10::CachingDeviceAllocator::DeviceStats*) = nullptr;
  void (*reset_peak_memory_stats)(int) = nullptr;
};

// The module's path beside the binary or library this code is part of (the Python
// package's extension module, with the module beside it in the wheel); "" when unknown.
std::string beside_this_code() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&beside_this_code), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  return (std::filesystem::path(info.dli_fname).parent_path() / SGPU_CUDA_MODULE_FILE_NAME)
      .string();
}

const RuntimeModule& runtime_module() {
  static const RuntimeModule module = [] {
    const std::string named = contract::setting_text("SGPU_CUDA_MODULE");
    std::string path = !named.empty() ? named : SGPU_CUDA_MODULE_PATH;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    // Built here, used elsewhere: beside this code (a wheel), then the install prefix.
    for (const std::string& other :
         {beside_this_code(), std::string(SGPU_CUDA_MODULE_INSTALLED_PATH)}) {
      if (handle != nullptr || !named.empty() || other.empty()) continue;
      path = other;
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    }
    if (handle == nullptr) {
      throw std::runtime_error("sgpu: cannot load the CUDA runtime module " + path + ": " +
                               dlerror() + " (set SGPU_CUDA_MODULE to its path)");
    }
    RuntimeModule m;
    m.bind = reinterpret_cast<void (*)(int, double)>(dlsym(handle, "sgpu_cuda_bind"));
    m.make_process_group = reinterpret_cast<decltype(m.make_process_group)>(
        dlsym(handle, "sgpu_cuda_make_process_group"));
    m.memory_stats =
        reinterpret_cast<decltype(m.memory_stats)>(dlsym(handle, "sgpu_cuda_memory_stats"));
    m.reset_peak_memory_stats = reinterpret_cast<decltype(m.reset_peak_memory_stats)>(
        dlsym(handle, "sgpu_cuda_reset_peak_memory_stats"));
    if (m.bind == nullptr || m.make_process_group == nullptr || m.memory_stats == nullptr ||
        m.reset_peak_memory_stats == nullptr) {
      throw std::runtime_error("sgpu: " + path + " is not sgpu's CUDA runtime module");
    }
    return m;
  }();
  return module;
}

}  // namespace

void CudaBackend::bind(int device_index) const {
  const std::optional<contract::OptionValue> fraction =
      contract::setting_value("SGPU_CUDA_MEMORY_FRACTION");
  runtime_module().bind(device_index, fraction ? std::get<double>(*fraction) : 0.0);
}

std::vector<std::string> CudaBackend::rank_environment(const Options& options) const {
  // The platform a user names for predicted times beside the measured ones (NOTE [The
  // collective model]): ConfigError before any rank starts when it does not load.
  if (const std::string platform = contract::setting_text(contract::kPlatformVar);
      !platform.empty()) {
    model::load_platform(platform);
  }
  (void)contract::setting_value("SGPU_CUDA_MEMORY_FRACTION");  // its ConfigError, before any rank
  return {};
}

void CudaBackend::reset_peak_memory_stats(int device_index) const {
  runtime_module().reset_peak_memory_stats(device_index);
}

MemoryStats CudaBackend::memory_stats(int device_index) const {
  c10::CachingDeviceAllocator::DeviceStats stats;
  runtime_module().memory_stats(device_index, &stats);
  return backend::memory_stats_of(stats);
}

namespace {

// NCCL for cuda tensors, and Gloo beside it for CPU ones (collectives/routes.h): a group
// made with "sgpu" registers for both, as "cpu:gloo,cuda:nccl" does.
class NcclGroups final : public backend::ProcessGroupFactory {
 public:
  c10::intrusive_ptr<c10d::Backend> make(
      const backend::ProcessGroupRequest& request) const override {
    c10::intrusive_ptr<c10d::Backend> nccl;
    runtime_module().make_process_group(&request, &nccl);
    auto host =
        collectives::gloo_group(c10::make_intrusive<c10d::PrefixStore>("host", request.store),
                                request.rank, request.world_size, request.timeout);
    auto group = collectives::routed_by_device(std::move(nccl), std::move(host));
    return request.record ? request.record(std::move(group)) : group;
  }
};

}  // namespace

const backend::ProcessGroupFactory& CudaBackend::process_groups() const {
  static const NcclGroups groups;
  return groups;
}

std::unique_ptr<backend::Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace sgpu::cuda
