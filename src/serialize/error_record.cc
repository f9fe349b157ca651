#include "serialize/error_record.h"

#include <sys/stat.h>

#include <fstream>
#include <limits>
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

namespace {

// j[key] when it is an integer from lo to hi, else `otherwise`: a record torn or written by
// something else must not make the reader convert 1e28 to an integer.
std::int64_t integer_or(const nlohmann::json& j, const char* key, std::int64_t otherwise,
                        std::int64_t lo, std::int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return otherwise;
  if (it->is_number_unsigned()) {
    const auto v = it->get<std::uint64_t>();
    return v <= static_cast<std::uint64_t>(hi) ? static_cast<std::int64_t>(v) : otherwise;
  }
  const auto v = it->get<std::int64_t>();
  return v >= lo && v <= hi ? v : otherwise;
}

}  // namespace

std::optional<ErrorRecord> read_error_record(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    ErrorRecord record;
    record.type = j.value("type", "");
    record.message = j.value("message", "");
    record.rank = static_cast<int>(integer_or(j, "rank", -1, -1, 1 << 30));
    record.time = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(
            integer_or(j, "timestamp_ns", 0, 0, std::numeric_limits<std::int64_t>::max()))));
    record.backtrace = j.value("backtrace", std::vector<std::string>{});
    return record;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::optional<ErrorRecord> read_torchelastic_error(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    const nlohmann::json& outer = j.at("message");
    ErrorRecord record;
    // "ValueError: boom": the type before the first ": ", as torch writes it.
    const std::string text =
        outer.is_string() ? outer.get<std::string>() : outer.value("message", "");
    const auto colon = text.find(": ");
    if (colon != std::string::npos && text.find_first_of(" \n") >= colon) {
      record.type = text.substr(0, colon);
      record.message = text.substr(colon + 2);
    } else {
      record.message = text;
    }
    if (outer.is_object() && outer.contains("extraInfo")) {
      std::string stack = outer["extraInfo"].value("py_callstack", "");
      for (std::size_t start = 0; start < stack.size();) {
        const auto nl = stack.find('\n', start);
        record.backtrace.push_back(stack.substr(start, nl - start));
        if (nl == std::string::npos) break;
        start = nl + 1;
      }
    }
    // The file's own time: torch's timestamp is in whole seconds, too coarse to order ranks.
    struct stat info {};
    if (::stat(path.c_str(), &info) == 0) {
      record.time = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::seconds(info.st_mtim.tv_sec) +
              std::chrono::nanoseconds(info.st_mtim.tv_nsec)));
    }
    return record;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

}  // namespace sgpu::serialize
