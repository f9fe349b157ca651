#include "sim/node_spec.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "backend/gpu_type.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "model/platform.h"
#include "sgpu/errors.h"

namespace sgpu::sim {
namespace {

[[noreturn]] void bad_spec(std::string_view spec, const std::string& why) {
  throw ConfigError("bad simulated node spec \"" + std::string(spec) + "\": " + why +
                    ". Write it as COUNTxTYPE[:MEMORY] joined by '+', e.g. \"8xH100\", "
                    "\"4xH100+4xA10\", \"2xH200:40GiB\"");
}

std::uint64_t parse_memory(std::string_view spec, std::string_view text) {
  std::uint64_t number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || end == text.data() || number == 0) {
    bad_spec(spec, "memory \"" + std::string(text) + "\" is not a positive size");
  }
  const std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  if (unit == "GiB" || unit == "G" || unit == "GB") {
    return unit == "GB" ? number * 1000 * 1000 * 1000 : number << 30;
  }
  if (unit == "MiB" || unit == "M" || unit == "MB") {
    return unit == "MB" ? number * 1000 * 1000 : number << 20;
  }
  bad_spec(spec, "memory unit \"" + std::string(unit) + "\" is not GiB, GB, MiB or MB");
}

}  // namespace

backend::Inventory parse_node_spec(std::string_view full_spec) {
  backend::Inventory inventory;
  inventory.node = "simulated node " + std::string(full_spec);
  inventory.sim_spec = std::string(full_spec);
  std::string_view spec = full_spec;
  if (const std::size_t at = spec.find('@'); at != std::string_view::npos) {
    if (at + 1 == spec.size()) bad_spec(full_spec, "\"@\" names no platform");
    spec = spec.substr(0, at);
  }
  if (spec.empty()) bad_spec(full_spec, "it is empty");
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t plus = spec.find('+', start);
    const std::string_view part =
        spec.substr(start, plus == std::string_view::npos ? std::string_view::npos : plus - start);
    const std::size_t x = part.find_first_of("xX");
    if (x == std::string_view::npos || x == 0) {
      bad_spec(spec, "\"" + std::string(part) + "\" is not COUNTxTYPE");
    }
    int count = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + x, count);
    if (ec != std::errc() || end != part.data() + x || count < 1 || count > 1024) {
      bad_spec(spec, "count \"" + std::string(part.substr(0, x)) + "\" is not 1 to 1024");
    }
    std::string_view type_text = part.substr(x + 1);
    std::string_view memory_text;
    if (const std::size_t colon = type_text.find(':'); colon != std::string_view::npos) {
      memory_text = type_text.substr(colon + 1);
      type_text = type_text.substr(0, colon);
    }
    const auto type = backend::parse_gpu_type(type_text);
    if (!type) {
      bad_spec(spec, "unknown GPU type \"" + std::string(type_text) +
                         "\" (known: " + backend::known_gpu_types_text() + ")");
    }
    const backend::GpuModel& model = *backend::find_gpu_model(*type);
    const std::uint64_t memory =
        memory_text.empty() ? model.capacity_bytes : parse_memory(spec, memory_text);
    for (int i = 0; i < count; ++i) {
      backend::Gpu gpu;
      gpu.index = static_cast<int>(inventory.gpus.size());
      gpu.type = *type;
      gpu.name = std::string(model.device_name) + " (simulated)";
      gpu.memory_bytes = memory;
      gpu.capability_major = model.capability_major;
      gpu.capability_minor = model.capability_minor;
      gpu.multi_processor_count = model.multi_processor_count;
      inventory.gpus.push_back(std::move(gpu));
    }
    if (plus == std::string_view::npos) break;
    start = plus + 1;
  }
  return inventory;
}

std::string platform_of_spec(std::string_view spec) {
  const backend::Inventory node = parse_node_spec(spec);
  std::string platform;
  if (const std::size_t at = spec.find('@'); at != std::string_view::npos) {
    platform = std::string(spec.substr(at + 1));
  } else {
    platform = contract::setting_text(contract::kPlatformVar);
  }
  if (platform.empty()) {
    const std::string& type = node.gpus.front().type;
    for (const backend::Gpu& gpu : node.gpus)
      if (gpu.type != type) return "";
    platform = model::default_platform_for(type).value_or("");
    return platform;
  }
  model::load_platform(platform);  // ConfigError naming it and the platforms there are
  return platform;
}

namespace {

// The UUID torch.cuda.get_device_properties() gives simulated GPU `index`
// (python/sgpu/_sim_cuda.py), as CUDA_VISIBLE_DEVICES spells it.
std::string uuid_of(int index) {
  std::string digits = std::to_string(index);
  return "GPU-00000000-0000-0000-0000-" +
         std::string(12 - std::min<std::size_t>(12, digits.size()), '0') + digits;
}

// The device `entry` names among `count`, as CUDA reads one entry of the list.
std::optional<int> named_device(std::string_view entry, int count) {
  while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
  while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
  if (entry.starts_with("GPU-")) {
    std::optional<int> found;
    for (int i = 0; i < count; ++i) {
      if (!uuid_of(i).starts_with(entry)) continue;
      if (found) return std::nullopt;  // a prefix of two UUIDs names neither
      found = i;
    }
    return found;
  }
  int index = -1;
  const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), index);
  if (ec != std::errc() || end == entry.data() || index < 0 || index >= count) return std::nullopt;
  return index;  // CUDA, as strtol, reads the leading digits ("1abc" is 1)
}

}  // namespace

std::vector<int> visible_indices(int count, const char* visible) {
  std::vector<int> seen;
  if (visible == nullptr) {
    for (int i = 0; i < count; ++i) seen.push_back(i);
    return seen;
  }
  std::vector<bool> taken(static_cast<std::size_t>(count), false);
  std::string_view rest = visible;
  for (;;) {
    const std::size_t comma = rest.find(',');
    const std::optional<int> index = named_device(rest.substr(0, comma), count);
    if (!index) break;
    if (taken[*index]) return {};  // a device named twice: none, as CUDA
    taken[*index] = true;
    seen.push_back(*index);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return seen;
}

backend::Inventory visible_devices(backend::Inventory node, const char* visible) {
  if (visible == nullptr) return node;
  std::vector<Gpu> seen;
  for (const int index : visible_indices(static_cast<int>(node.gpus.size()), visible)) {
    Gpu gpu = node.gpus[index];
    gpu.index = static_cast<int>(seen.size());
    seen.push_back(std::move(gpu));
  }
  node.gpus = std::move(seen);
  if (node.gpus.empty()) {
    node.unavailable_reason = "CUDA_VISIBLE_DEVICES=\"" + std::string(visible) +
                              "\" hides every GPU of the simulated node " + node.sim_spec;
  }
  return node;
}

backend::Inventory visible_node(std::string_view spec) {
  return visible_devices(parse_node_spec(spec), std::getenv("CUDA_VISIBLE_DEVICES"));
}

}  // namespace sgpu::sim
