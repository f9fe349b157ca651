#include "serialize/error_record.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "contract/atomic_file.h"

namespace sgpu::serialize {

void write_error_record(const std::filesystem::path& path, const ErrorRecord& record) {
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(record.time.time_since_epoch()).count();
  nlohmann::json j = {{"type", record.type},
                      {"message", record.message},
                      {"rank", record.rank},
                      {"timestamp_ns", ns},
                      {"backtrace", record.backtrace}};
  // Replace invalid UTF-8 in messages rather than failing to report the error at all.
  contract::write_file_atomically(
      path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

std::optional<ErrorRecord> read_error_record(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    ErrorRecord record;
    record.type = j.value("type", "");
    record.message = j.value("message", "");
    record.rank = j.value("rank", -1);
    record.time = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(j.value("timestamp_ns", std::int64_t{0}))));
    record.backtrace = j.value("backtrace", std::vector<std::string>{});
    return record;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace sgpu::serialize
