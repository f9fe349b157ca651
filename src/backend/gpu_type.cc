#include "backend/gpu_type.h"

#include <algorithm>
#include <cctype>

namespace sgpu::backend {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// A capacity as torch prints it (two decimals of GiB), to the MiB below.
constexpr std::uint64_t gib(double value) { return static_cast<std::uint64_t>(value * 1024) << 20; }

std::string upper(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return out;
}

}  // namespace

const std::vector<GpuModel>& gpu_models() {
  // Capacities: H100 SXM, A100 80GB and A10G as their published out-of-memory messages
  // give them (docs/simulation.md, "Device memory on sim"); A10 as A10G (NVML reports the
  // same memory), A800 as A100, H800 as H100; H200 as NVML's 143,771 MiB less the H100's
  // 0.54 GiB offset.
  // The rest are estimates: the label's memory less the 1.1% the H100 loses.
  // Compute capabilities are CUDA's table; SM counts NVIDIA's architecture whitepapers and
  // product briefs (the SXM variant where there are several: H100 PCIe has 114). L2 caches
  // as the same sources give them for the variant named (the H100 SXM enables 50 MiB of its
  // die's 60; H20 and GH200 the whole 60).
  static const std::vector<GpuModel> models = {
      {"H100", "NVIDIA H100 80GB HBM3", 80 * kGiB, gib(79.11), 9, 0, 132, 50 * kMiB},
      {"H200", "NVIDIA H200", 141 * kGiB, gib(139.86), 9, 0, 132, 50 * kMiB},
      {"H20", "NVIDIA H20", 96 * kGiB, gib(94.93), 9, 0, 78, 60 * kMiB},
      {"H800", "NVIDIA H800", 80 * kGiB, gib(79.11), 9, 0, 132, 50 * kMiB},
      {"GH200", "NVIDIA GH200 480GB", 96 * kGiB, gib(94.93), 9, 0, 132, 60 * kMiB},
      {"B200", "NVIDIA B200", 180 * kGiB, gib(178.00), 10, 0, 148, 126 * kMiB},
      {"B300", "NVIDIA B300", 270 * kGiB, gib(267.00), 10, 3, 148, 126 * kMiB},
      {"GB200", "NVIDIA GB200", 186 * kGiB, gib(183.93), 10, 0, 148, 126 * kMiB},
      {"A100", "NVIDIA A100-SXM4-80GB", 80 * kGiB, gib(79.14), 8, 0, 108, 40 * kMiB},
      {"A800", "NVIDIA A800-SXM4-80GB", 80 * kGiB, gib(79.14), 8, 0, 108, 40 * kMiB},
      {"A40", "NVIDIA A40", 48 * kGiB, gib(47.47), 8, 6, 84, 6 * kMiB},
      {"A30", "NVIDIA A30", 24 * kGiB, gib(23.73), 8, 0, 56, 24 * kMiB},
      {"A10", "NVIDIA A10", 24 * kGiB, gib(22.30), 8, 6, 72, 6 * kMiB},
      {"A10G", "NVIDIA A10G", 24 * kGiB, gib(22.30), 8, 6, 80, 6 * kMiB},
      {"L40S", "NVIDIA L40S", 48 * kGiB, gib(47.47), 8, 9, 142, 96 * kMiB},
      {"L40", "NVIDIA L40", 48 * kGiB, gib(47.47), 8, 9, 142, 96 * kMiB},
      {"L4", "NVIDIA L4", 24 * kGiB, gib(23.73), 8, 9, 58, 48 * kMiB},
      {"V100", "Tesla V100-SXM2-32GB", 32 * kGiB, gib(31.64), 7, 0, 80, 6 * kMiB},
      {"T4", "Tesla T4", 16 * kGiB, gib(15.82), 7, 5, 40, 4 * kMiB},
  };
  return models;
}

std::string known_gpu_types_text() {
  std::string text;
  for (const GpuModel& model : gpu_models()) {
    if (!text.empty()) text += ", ";
    text += model.type;
  }
  return text;
}

const GpuModel* find_gpu_model(std::string_view type) {
  for (const GpuModel& model : gpu_models()) {
    if (model.type == type) return &model;
  }
  return nullptr;
}

std::optional<std::string> parse_gpu_type(std::string_view requested) {
  std::string wanted = upper(requested);
  // serverless_gpu's GPUType.H100 as text (str() of the enum, or a name copied from code).
  if (wanted.rfind("GPUTYPE.", 0) == 0) wanted.erase(0, 8);
  if (const GpuModel* model = find_gpu_model(wanted)) return std::string(model->type);
  return std::nullopt;
}

std::string normalize_device_name(std::string_view device_name) {
  // Drop the vendor and family words, then take the model token up to the first space or
  // dash: "NVIDIA A100-SXM4-80GB" -> "A100", "Tesla V100-SXM2-16GB" -> "V100".
  std::string name = upper(device_name);
  for (std::string_view prefix : {"NVIDIA ", "TESLA ", "GEFORCE ", "QUADRO "}) {
    if (name.rfind(prefix, 0) == 0) name.erase(0, prefix.size());
  }
  const auto end = name.find_first_of(" -");
  return name.substr(0, end);
}

}  // namespace sgpu::backend
