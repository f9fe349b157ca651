// Random identifiers in MLflow's shapes, drawn from the OS's generator (getrandom) each
// time, so that no thread, process or forked child repeats another's.
#pragma once

#include <cstddef>
#include <string>

namespace sgpu::tracking {

// `digits` lowercase hex digits (a run id is 32, as uuid4().hex).
std::string random_hex(std::size_t digits);
// 18 decimal digits without a leading zero, as MLflow's file store numbers experiments.
std::string random_experiment_id();

}  // namespace sgpu::tracking
