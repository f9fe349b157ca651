#include "serialize/node_report.h"

#include <array>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace sgpu::serialize {

namespace {

constexpr std::array kKinds = {RankFailure::Kind::kOk,        RankFailure::Kind::kException,
                               RankFailure::Kind::kExitCode,  RankFailure::Kind::kSignal,
                               RankFailure::Kind::kBadResult, RankFailure::Kind::kTimedOut,
                               RankFailure::Kind::kTerminated};

RankFailure::Kind kind_named(const std::string& name) {
  for (const RankFailure::Kind kind : kKinds) {
    if (to_string(kind) == name) return kind;
  }
  throw std::invalid_argument("no rank status is called \"" + name + "\"");
}

// An integer field within [lo, hi]; a number that is not one (a double, which is what a
// number too large for an integer parses as) is no report of ours.
template <typename T>
T integer(const nlohmann::json& object, const char* key) {
  const nlohmann::json& value = object.at(key);
  if (!value.is_number_integer()) throw std::invalid_argument(std::string(key) + " is no integer");
  if (value.is_number_unsigned()) {
    const auto n = value.get<std::uint64_t>();
    if (n > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      throw std::invalid_argument(std::string(key) + " is out of range");
    }
    return static_cast<T>(n);
  }
  const auto n = value.get<std::int64_t>();
  if (n < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
      n > static_cast<std::int64_t>(std::numeric_limits<T>::max())) {
    throw std::invalid_argument(std::string(key) + " is out of range");
  }
  return static_cast<T>(n);
}

}  // namespace

std::string node_report_json(const NodeReport& report) {
  nlohmann::json rows = nlohmann::json::array();
  for (const RankFailure& row : report.rows) {
    nlohmann::json r = {
        {"rank", row.rank},
        {"local_rank", row.local_rank},
        {"node", row.node_rank},
        {"host", row.host},
        {"pid", row.pid},
        {"kind", to_string(row.kind)},
        {"exception_type", row.exception_type},
        {"message", row.message},
        {"stderr_tail", row.stderr_tail},
        {"time_ns",
         std::chrono::duration_cast<std::chrono::nanoseconds>(row.time.time_since_epoch()).count()},
    };
    if (row.exit_code) r["exit_code"] = *row.exit_code;
    if (row.signal) r["signal"] = *row.signal;
    rows.push_back(std::move(r));
  }
  const nlohmann::json doc = {{"node", report.node_rank},
                              {"host", report.host},
                              {"run_dir", report.run_dir.string()},
                              {"rows", std::move(rows)}};
  // Invalid UTF-8 in a rank's stderr is replaced, never a reason to lose the report.
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

NodeReport parse_node_report(std::string_view json) {
  try {
    const nlohmann::json doc = nlohmann::json::parse(json);
    NodeReport report;
    report.node_rank = integer<int>(doc, "node");
    report.host = doc.at("host").get<std::string>();
    report.run_dir = doc.at("run_dir").get<std::string>();
    for (const nlohmann::json& r : doc.at("rows")) {
      RankFailure row;
      row.rank = integer<int>(r, "rank");
      row.local_rank = integer<int>(r, "local_rank");
      row.node_rank = integer<int>(r, "node");
      row.host = r.at("host").get<std::string>();
      row.pid = integer<pid_t>(r, "pid");
      row.kind = kind_named(r.at("kind").get<std::string>());
      row.exception_type = r.at("exception_type").get<std::string>();
      row.message = r.at("message").get<std::string>();
      row.stderr_tail = r.at("stderr_tail").get<std::string>();
      row.time = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::nanoseconds(integer<std::int64_t>(r, "time_ns"))));
      if (r.contains("exit_code")) row.exit_code = integer<int>(r, "exit_code");
      if (r.contains("signal")) row.signal = integer<int>(r, "signal");
      report.rows.push_back(std::move(row));
    }
    return report;
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("not a node's report: ") + e.what());
  }
}

std::string shared_run_json(const SharedRun& run) {
  return nlohmann::json{
      {"uri", run.uri}, {"experiment_id", run.experiment_id}, {"run_id", run.run_id}}
      .dump();
}

SharedRun parse_shared_run(std::string_view json) {
  try {
    const nlohmann::json doc = nlohmann::json::parse(json);
    return {doc.at("uri").get<std::string>(), doc.at("experiment_id").get<std::string>(),
            doc.at("run_id").get<std::string>()};
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(std::string("not a shared run: ") + e.what());
  }
}

}  // namespace sgpu::serialize
