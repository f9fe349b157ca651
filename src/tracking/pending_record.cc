// The pending run's record, tracking-pending.json (NOTE [Pending runs] in pending.h):
// written and read apart from the sending, which needs the stores.
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>

#include "contract/atomic_file.h"
#include "sgpu/errors.h"
#include "tracking/pending.h"

namespace sgpu::tracking {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string pending_text(const PendingRun& pending) {
  json j = {{"uri", pending.uri},
            {"run_id", pending.run_id},
            {"status", status_name(pending.status)},
            {"end_time_ms", pending.end_time_ms},
            {"remove_folder", pending.remove_folder}};
  if (pending.in_flight) j["in_flight"] = true;
  return j.dump(2) + "\n";
}

}  // namespace

std::optional<PendingRun> read_pending(const fs::path& record) {
  std::ifstream in(record);
  const json j = json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("uri") || !j.contains("run_id")) return std::nullopt;
  PendingRun p;
  try {
    p.uri = j["uri"].get<std::string>();
    p.run_id = j["run_id"].get<std::string>();
    p.status = status_from_name(j.value("status", "FAILED"));
    // A number too large for an integer parses as a double, which no integer can hold.
    if (j.contains("end_time_ms") && !j["end_time_ms"].is_number_integer()) return std::nullopt;
    p.end_time_ms = j.value("end_time_ms", std::int64_t{0});
    p.remove_folder = j.value("remove_folder", false);
    p.in_flight = j.value("in_flight", false);
  } catch (const json::exception&) {  // a field of the wrong type: not a record of ours
    return std::nullopt;
  }
  if (p.status == RunStatus::kRunning) p.status = RunStatus::kFailed;  // a run ends finished
  return p;
}

void write_pending(const fs::path& run_dir, const PendingRun& pending) {
  const fs::path path = contract::RunFolder{run_dir}.tracking_pending();
  try {
    contract::write_file_atomically(path, pending_text(pending));
  } catch (const std::system_error& e) {
    throw TrackingError(std::string("tracking: cannot record the pending run: ") + e.what());
  }
}

}  // namespace sgpu::tracking
