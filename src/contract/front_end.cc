#include "contract/front_end.h"

#include <atomic>
#include <map>

namespace sgpu::contract {
namespace {

std::atomic<FrontEnd> g_front_end{FrontEnd::kCpp};

// The sgpu command's flag for each Options member it has one for.
std::string flag_of(std::string_view setting) {
  static const std::map<std::string_view, std::string_view> flags = {
      {"gpus", "--gpus"},
      {"gpu_type", "--gpu-type"},
      {"backend", "--backend"},
      {"timeout", "--timeout"},
      {"runs_dir", "--log-dir"},
      {"console_ranks", "--ranks"},
      {"name", "--run-name"},
      {"experiment", "--experiment"},
      {"tracking", "--no-tracking"},
      {"hang_timeout", "--hang-timeout"},
      {"nnodes", "--nnodes"},
      {"node_rank", "--node-rank"},
      {"rdzv_endpoint", "--rdzv-endpoint"},
      {"rdzv_id", "--rdzv-id"},
      {"rdzv_timeout", "--rdzv-timeout"},
      {"sim_compute", "--sim-compute"},
  };
  const auto it = flags.find(setting);
  return it != flags.end() ? std::string(it->second) : std::string(setting);
}

}  // namespace

void set_front_end(FrontEnd front_end) { g_front_end = front_end; }
FrontEnd front_end() { return g_front_end; }

std::string spell(std::string_view setting, std::string_view value) {
  if (front_end() == FrontEnd::kCommand) return flag_of(setting) + " " + std::string(value);
  const bool number = !value.empty() && value.find_first_not_of("0123456789") == value.npos;
  return std::string(setting) + "=" +
         (number ? std::string(value) : "\"" + std::string(value) + "\"");
}

std::string spell(std::string_view setting) {
  if (front_end() == FrontEnd::kCommand) return flag_of(setting);
  if (front_end() == FrontEnd::kPython) return std::string(setting);
  return "Options::" + std::string(setting);
}

std::string spell_no_timeout() {
  switch (front_end()) {
    case FrontEnd::kCommand:
      return "--timeout none";
    case FrontEnd::kPython:
      return "timeout=None";
    case FrontEnd::kCpp:
      break;
  }
  return "sgpu::kNoTimeout";
}

std::string spell_none(std::string_view setting) {
  switch (front_end()) {
    case FrontEnd::kCommand:
      return flag_of(setting) + " none";
    case FrontEnd::kPython:
      return std::string(setting) + "=None";
    case FrontEnd::kCpp:
      break;
  }
  return "Options::" + std::string(setting) + " = sgpu::kNoTimeout";
}

}  // namespace sgpu::contract
