// The logger of a rank process: what sgpu::log_metric and friends use inside a rank.
//
// Created at the first logging call from the variables the launcher gives the rank
// (MLFLOW_RUN_ID, MLFLOW_TRACKING_URI, SGPU_RANK_DIR for the spool); absent when the call
// is not tracked (SGPU_TRACKING=off, or no MLFLOW_RUN_ID). The launcher's rank code
// closes it when the function returns or throws, and on SIGTERM (rank/rank_main.cc),
// since a rank ends with _exit and no destructor would flush it.
#pragma once

#include <chrono>

namespace sgpu::tracking {

class RunLogger;

// nullptr when this rank's call is not tracked.
RunLogger* rank_logger();
// Sends what is buffered within `limit` and spools the rest; no-op when nothing was
// logged. Safe to call more than once.
void close_rank_logger(std::chrono::milliseconds limit);
// True once rank_logger() created a logger. Async-signal-safe.
bool rank_logger_started();

}  // namespace sgpu::tracking
