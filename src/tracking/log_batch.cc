#include "tracking/log_batch.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "tracking/validation.h"

namespace sgpu::tracking {
namespace {

using nlohmann::json;

json metric_value(double value) {
  // Protobuf's JSON mapping spells the doubles JSON has no literal for as strings.
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return value;
}

// Appends `items` to `pieces` in batches of at most `limit`, each holding only them.
template <class T>
void append_chunks(std::vector<Batch>& pieces, const std::vector<T>& items, std::size_t limit,
                   std::vector<T> Batch::*field) {
  for (std::size_t i = 0; i < items.size(); i += limit) {
    Batch piece;
    const auto end = std::min(items.size(), i + limit);
    (piece.*field)
        .assign(items.begin() + static_cast<std::ptrdiff_t>(i),
                items.begin() + static_cast<std::ptrdiff_t>(end));
    pieces.push_back(std::move(piece));
  }
}

}  // namespace

std::vector<Batch> split_batch(const Batch& batch) {
  std::vector<Batch> pieces;
  append_chunks(pieces, batch.params, kMaxParamsTagsPerBatch, &Batch::params);
  append_chunks(pieces, batch.tags, kMaxParamsTagsPerBatch, &Batch::tags);
  append_chunks(pieces, batch.metrics, kMaxMetricsPerBatch, &Batch::metrics);
  return pieces;
}

std::string log_batch_body(const std::string& run_id, const Batch& batch) {
  json body = {{"run_id", run_id}};
  json metrics = json::array(), params = json::array(), tags = json::array();
  for (const Metric& m : batch.metrics) {
    metrics.push_back({{"key", m.key},
                       {"value", metric_value(m.value)},
                       {"timestamp", m.timestamp_ms},
                       {"step", m.step}});
  }
  for (const Param& p : batch.params) params.push_back({{"key", p.key}, {"value", p.value}});
  for (const Tag& t : batch.tags) tags.push_back({{"key", t.key}, {"value", t.value}});
  if (!metrics.empty()) body["metrics"] = std::move(metrics);
  if (!params.empty()) body["params"] = std::move(params);
  if (!tags.empty()) body["tags"] = std::move(tags);
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace sgpu::tracking
