#include "serialize/memory_record.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "contract/atomic_file.h"

namespace sgpu::serialize {
namespace {

// The file's JSON object; a discarded value (not an object) when it is missing or is not.
nlohmann::json read_object(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json(nlohmann::json::value_t::discarded);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

}  // namespace

void write_memory_record(const std::filesystem::path& path, const MemoryStats& stats) {
  contract::write_file_atomically(path, nlohmann::json(stats).dump(1) + "\n");
}

std::optional<MemoryStats> read_memory_record(const std::filesystem::path& path) {
  const nlohmann::json json = read_object(path);
  if (!json.is_object()) return std::nullopt;
  MemoryStats stats;
  for (const auto& [key, value] : json.items()) {
    if (!value.is_number_integer()) return std::nullopt;
    stats[key] = value.get<std::int64_t>();
  }
  return stats;
}

void write_compute_record(const std::filesystem::path& path, const ComputeStats& stats) {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, t] : stats.ops) {
    ops[op] = {{"count", t.count},
               {"flops", t.flops},
               {"bytes", t.bytes},
               {"predicted_seconds", t.predicted_seconds}};
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const StepMark& step : stats.steps) {
    steps.push_back({{"end", step.end},
                     {"compute_end", step.compute_end},
                     {"tokens", step.tokens},
                     {"model_flops", step.model_flops}});
  }
  const nlohmann::json record = {{"platform", stats.platform},
                                 {"ops", ops},
                                 {"exposed_collective_seconds", stats.exposed_collective_seconds},
                                 {"unvalidated_seconds", stats.unvalidated_seconds},
                                 {"steps", steps}};
  contract::write_file_atomically(path, record.dump(1) + "\n");
}

std::optional<ComputeStats> read_compute_record(const std::filesystem::path& path) {
  const nlohmann::json json = read_object(path);
  if (!json.is_object() || !json.contains("ops") || !json["ops"].is_object()) return std::nullopt;
  ComputeStats stats;
  try {
    stats.platform = json.value("platform", "");
    stats.exposed_collective_seconds = json.value("exposed_collective_seconds", 0.0);
    stats.unvalidated_seconds = json.value("unvalidated_seconds", 0.0);
    for (const auto& [op, t] : json["ops"].items()) {
      stats.ops[op] = {t.at("count").get<std::int64_t>(), t.at("flops").get<double>(),
                       t.at("bytes").get<double>(), t.at("predicted_seconds").get<double>()};
    }
    for (const nlohmann::json& step : json.value("steps", nlohmann::json::array())) {
      stats.steps.push_back({step.at("end").get<double>(), step.at("compute_end").get<double>(),
                             step.at("tokens").get<double>(),
                             step.at("model_flops").get<double>()});
    }
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  return stats;
}

}  // namespace sgpu::serialize
