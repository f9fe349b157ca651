// MLflow's runs/log-batch request: its body and the server's limits per request, the
// format the REST store sends (rest/rest_store.h) and the spool keeps (tracking/spool.h).
#pragma once

#include <string>
#include <vector>

#include "tracking/run_model.h"

namespace sgpu::tracking {

// Splits `batch` into pieces MLflow's log-batch accepts in one request, in order.
std::vector<Batch> split_batch(const Batch& batch);
// The JSON body of runs/log-batch for `batch`.
std::string log_batch_body(const std::string& run_id, const Batch& batch);

}  // namespace sgpu::tracking
