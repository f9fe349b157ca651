// GPU types as normalised names: "NVIDIA H100 80GB HBM3" is "H100".
//
// One table serves device detection (cuda), node specs (sim), user input
// (case-insensitive), the messages of accelerator-mismatch errors, and what torch.cuda
// answers about a simulated device (NOTE [CUDA on sim]): the C++ and the Python side read
// these facts here, and nowhere else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sgpu::backend {

struct GpuModel {
  std::string_view type;         // normalised name, e.g. "H100"
  std::string_view device_name;  // what the driver reports for the common variant
  std::uint64_t memory_bytes;    // memory of the common variant
  // What CUDA offers PyTorch on the common variant: the "total capacity" of torch's
  // out-of-memory message, somewhat below the memory on the label. A simulated device of
  // this type has this much unless its node spec says otherwise.
  std::uint64_t capacity_bytes;
  int capability_major;  // CUDA compute capability, as torch.cuda.get_device_capability()
  int capability_minor;
  int multi_processor_count;     // streaming multiprocessors
  std::uint64_t l2_cache_bytes;  // as torch.cuda.get_device_properties().L2_cache_size
};

// Every type sgpu knows, in table order.
const std::vector<GpuModel>& gpu_models();
// "H100, H200, ..." for messages.
std::string known_gpu_types_text();

// The normalised type of a user's request ("h100" -> "H100"; serverless_gpu's enum as text,
// "GPUType.H100", too); nullopt when unknown.
std::optional<std::string> parse_gpu_type(std::string_view requested);

// The normalised type of a device name the driver reports; for a device sgpu does not
// know, the name's model token upper-cased ("NVIDIA Foo 9" -> "FOO").
std::string normalize_device_name(std::string_view device_name);

// The table entry of a normalised type; nullptr when unknown.
const GpuModel* find_gpu_model(std::string_view type);

}  // namespace sgpu::backend
