#include "tracking/spool.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "sgpu/errors.h"
#include "tracking/log_batch.h"

namespace sgpu::tracking {
namespace {

using nlohmann::json;

double value_of(const json& value) {
  if (value.is_number()) return value.get<double>();
  const std::string text = value.is_string() ? value.get<std::string>() : "NaN";
  if (text == "Infinity") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::numeric_limits<double>::quiet_NaN();
}

std::int64_t int64_of(const json& value) {
  if (value.is_number_integer()) return value.get<std::int64_t>();
  if (value.is_number_float()) {
    // Within +-2^62, so the conversion is defined; anything else is no timestamp or step
    // (found by tests/fuzz/decoders_fuzz.cc: 1.7e125 converted to an integer).
    const double v = value.get<double>();
    if (!(std::fabs(v) < 4.6e18)) throw std::out_of_range("spooled number out of range");
    return static_cast<std::int64_t>(v);
  }
  return std::strtoll(value.get<std::string>().c_str(), nullptr, 10);
}

}  // namespace

void spool_batch(const std::filesystem::path& file, const std::string& run_id, const Batch& batch) {
  const std::string line = log_batch_body(run_id, batch) + "\n";
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw TrackingError("tracking: cannot keep unsent metrics in " + file.string() + ": " +
                        std::strerror(errno));
  }
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int error = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) {
    throw TrackingError("tracking: cannot keep unsent metrics in " + file.string() + ": " +
                        (n < 0 ? std::strerror(error) : "short write"));
  }
}

std::vector<SpooledBatch> read_spool(const std::filesystem::path& file) {
  std::vector<SpooledBatch> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const json parsed = json::parse(line, nullptr, false);
    if (!parsed.is_object() || !parsed.contains("run_id")) continue;
    SpooledBatch spooled;
    try {
      spooled.run_id = parsed.at("run_id").get<std::string>();
      for (const json& m : parsed.value("metrics", json::array())) {
        spooled.batch.metrics.push_back({m.at("key").get<std::string>(), value_of(m.at("value")),
                                         int64_of(m.at("timestamp")), int64_of(m.at("step"))});
      }
      for (const json& p : parsed.value("params", json::array())) {
        spooled.batch.params.push_back(
            {p.at("key").get<std::string>(), p.at("value").get<std::string>()});
      }
      for (const json& t : parsed.value("tags", json::array())) {
        spooled.batch.tags.push_back(
            {t.at("key").get<std::string>(), t.at("value").get<std::string>()});
      }
    } catch (const std::exception&) {  // json's errors, and out_of_range above
      continue;                        // not a batch this file's writer wrote: damaged
    }
    out.push_back(std::move(spooled));
  }
  return out;
}

}  // namespace sgpu::tracking
