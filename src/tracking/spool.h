// The spool: batches a store could not take, kept in a file until they can be sent.
//
// One JSON line per batch (the run id and the log-batch body), appended with a single
// write on an O_APPEND descriptor, so writers in several processes never mix lines. The
// launcher sends a call's spools again when the call ends (tracking/call_run.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "tracking/run_model.h"

namespace sgpu::tracking {

struct SpooledBatch {
  std::string run_id;
  Batch batch;
};

// Appends; throws TrackingError when the file cannot be written.
void spool_batch(const std::filesystem::path& file, const std::string& run_id, const Batch& batch);
// Every whole line of `file`; a torn last line, or any line that is not a batch, is skipped.
std::vector<SpooledBatch> read_spool(const std::filesystem::path& file);

}  // namespace sgpu::tracking
