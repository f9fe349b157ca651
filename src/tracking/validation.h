// MLflow's rules for what a run accepts, applied before anything is buffered or sent.
//
// A key MLflow would refuse (too long, characters outside letters, digits, `_ - . : /`
// and space, or a path that is not in normal form: `a//b`, `/a`, `../a`) is a
// TrackingError that names the key and the rule, raised at the logging call, so a bad
// entry never reaches a batch and can never take its neighbours down with it. Values
// past MLflow's length limits are truncated to the limit, as MLflow's own client does
// (MLFLOW_TRUNCATE_LONG_VALUES); `truncated` says so.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "sgpu/errors.h"

namespace sgpu::tracking {

// MLflow's limits (mlflow/utils/validation.py).
inline constexpr std::size_t kMaxKeyLength = 250;
inline constexpr std::size_t kMaxParamValueLength = 6000;
inline constexpr std::size_t kMaxTagValueLength = 8000;
inline constexpr std::size_t kMaxMetricsPerBatch = 1000;
inline constexpr std::size_t kMaxParamsTagsPerBatch = 100;
inline constexpr std::size_t kMaxEntitiesPerBatch = 1000;

// Throws TrackingError when MLflow would refuse `key` for a `what` ("metric", "param",
// "tag").
void check_key(std::string_view what, std::string_view key);

// `value` cut to `limit` characters (whole UTF-8 sequences) when longer.
std::string truncate_value(std::string_view value, std::size_t limit, bool* truncated = nullptr);

}  // namespace sgpu::tracking
