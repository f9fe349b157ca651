#include "backend/backend.h"

#include "backend/gpu_type.h"
#include "backend/selection.h"
#include "contract/front_end.h"
#include "contract/option_table.h"
#include "sgpu/errors.h"

namespace sgpu {

std::string Inventory::summary() const {
  if (gpus.empty()) return "no GPU";
  // Runs of the same type in index order: "4 x H100 + 4 x A10".
  std::string text;
  std::size_t i = 0;
  while (i < gpus.size()) {
    std::size_t j = i;
    while (j < gpus.size() && gpus[j].type == gpus[i].type) ++j;
    if (!text.empty()) text += " + ";
    text += std::to_string(j - i) + " x " + gpus[i].type;
    i = j;
  }
  return text;
}

}  // namespace sgpu

namespace sgpu::backend {

std::string backend_advice(std::string_view backend, FrontEnd front_end) {
  const contract::Spelling spell(front_end);
  const std::string env = contract::environment_text("backend", front_end);
  if (env.empty()) return "pass " + spell("backend", backend);
  return "set SGPU_BACKEND=" + std::string(backend) + " (SGPU_BACKEND=" + env +
         " decides the backend here, whatever " + spell("backend") + " says)";
}

Selection select_devices(const Inventory& inventory, int gpus, const std::string& gpu_type,
                         std::string_view backend_name, FrontEnd front_end) {
  const contract::Spelling spell(front_end);
  const std::string node = inventory.summary();
  Selection selection;
  if (inventory.gpus.empty()) {
    throw AcceleratorMismatchError(std::to_string(gpus) + " GPU(s) requested but backend \"" +
                                   std::string(backend_name) + "\" offers none (" +
                                   inventory.unavailable_reason + "). Run on a GPU node, or " +
                                   backend_advice("sim", front_end) + " to simulate one");
  }
  if (!gpu_type.empty()) {
    const auto type = parse_gpu_type(gpu_type);
    if (!type) {
      throw AcceleratorMismatchError("unknown gpu_type \"" + gpu_type +
                                     "\"; known types: " + known_gpu_types_text() +
                                     ". This node has " + node + "; pass one of those, or leave " +
                                     spell("gpu_type") + " unset to detect it");
    }
    for (const Gpu& gpu : inventory.gpus) {
      if (gpu.type == *type) selection.device_indices.push_back(gpu.index);
    }
    if (selection.device_indices.empty()) {
      throw AcceleratorMismatchError(
          "gpu_type \"" + *type + "\" requested but this node has " + node + "; pass " +
          spell("gpu_type", inventory.gpus.front().type) +
          " or leave it unset to auto-detect, or run on a node with " + *type + " GPUs");
    }
    if (static_cast<int>(selection.device_indices.size()) < gpus) {
      throw AcceleratorMismatchError(
          std::to_string(gpus) + " x " + *type + " requested but this node has " + node +
          ", that is " + std::to_string(selection.device_indices.size()) + " x " + *type +
          "; pass " + spell("gpus", std::to_string(selection.device_indices.size())) + " or fewer");
    }
    selection.gpu_type = *type;
  } else {
    if (static_cast<int>(inventory.gpus.size()) < gpus) {
      throw AcceleratorMismatchError(
          std::to_string(gpus) + " GPUs requested but this node has " + node + "; pass " +
          spell("gpus", std::to_string(inventory.gpus.size())) + " or fewer");
    }
    const std::string& first = inventory.gpus.front().type;
    for (const Gpu& gpu : inventory.gpus) {
      if (gpu.type == first) selection.device_indices.push_back(gpu.index);
    }
    if (static_cast<int>(selection.device_indices.size()) < gpus) {
      throw AcceleratorMismatchError(
          std::to_string(gpus) + " GPUs requested without a gpu_type on a node that mixes types (" +
          node + "); name one in " + spell("gpu_type") +
          ", with at most as many GPUs as the node has of it");
    }
    selection.gpu_type = first;
  }
  selection.device_indices.resize(static_cast<std::size_t>(gpus));
  return selection;
}

}  // namespace sgpu::backend
