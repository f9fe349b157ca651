// Picks a backend from the generated table (backend_table.cc).
#include <map>
#include <mutex>

#include "backend/backend_table.h"
#include "backend/selection.h"
#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "sgpu/errors.h"

namespace sgpu::backend {

namespace {

std::string known_backends_text() {
  std::string text;
  for (const BackendEntry& entry : backend_table()) {
    if (!text.empty()) text += ", ";
    text += "\"" + std::string(entry.name) + "\"";
  }
  return text;
}

}  // namespace

const Backend& find_backend(std::string_view name) {
  // One instance per backend per process; the table is fixed at build time.
  static std::map<std::string, std::unique_ptr<Backend>, std::less<>> made;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (auto it = made.find(name); it != made.end()) return *it->second;
  for (const BackendEntry& entry : backend_table()) {
    if (entry.name == name) {
      return *made.emplace(std::string(name), entry.make()).first->second;
    }
  }
  throw ConfigError("unknown backend \"" + std::string(name) + "\"; this build has " +
                    known_backends_text() + " and \"auto\"");
}

const Backend& rank_backend(const contract::RankEnvironment& env) {
  return find_backend(env.backend.empty() ? contract::kSimBackend : env.backend);
}

void check_backend_name(std::string_view name) {
  if (name != "auto" && name != contract::kCudaBackend && name != contract::kSimBackend) {
    find_backend(name);  // ConfigError naming the backends there are
  }
}

const Backend& choose_backend(const Options& options) {
  const std::string& name = options.backend;
  if (name != "auto") return find_backend(name);
  std::string reasons;
  for (const BackendEntry& entry : backend_table()) {
    if (entry.name == contract::kSimBackend) continue;  // auto never picks simulated GPUs
    const Backend& candidate = find_backend(entry.name);
    const Inventory inventory = candidate.inventory(options);
    if (!inventory.gpus.empty()) return candidate;
    reasons += "; " + std::string(entry.name) + ": " + inventory.unavailable_reason;
  }
  if (reasons.empty()) reasons = "; this build has no real GPU backend (built without CUDA)";
  throw AcceleratorMismatchError(
      "backend \"auto\" found no GPU on this node" + reasons + ". To run on simulated GPUs, " +
      backend_advice("sim", options.front_end) +
      (contract::environment_text("backend", options.front_end).empty() ? " or set SGPU_BACKEND=sim"
                                                                        : ""));
}

}  // namespace sgpu::backend
