#include "serialize/memory_record.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "contract/atomic_file.h"

namespace sgpu::serialize {

void write_memory_record(const std::filesystem::path& path, const MemoryStats& stats) {
  contract::write_file_atomically(path, nlohmann::json(stats).dump(1) + "\n");
}

std::optional<MemoryStats> read_memory_record(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json json =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return std::nullopt;
  MemoryStats stats;
  for (const auto& [key, value] : json.items()) {
    if (!value.is_number_integer()) return std::nullopt;
    stats[key] = value.get<std::int64_t>();
  }
  return stats;
}

}  // namespace sgpu::serialize
