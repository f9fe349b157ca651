// The error record a rank writes when its function throws (rank-<N>/error.json).
//
// JSON, so that a person can read it, in the shape torchrun's error files use:
//   {"type": ..., "message": ..., "rank": N, "timestamp_ns": ..., "backtrace": [...]}
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace sgpu::serialize {

struct ErrorRecord {
  std::string type;     // demangled exception type, e.g. "std::runtime_error"
  std::string message;  // what()
  int rank = -1;
  std::chrono::system_clock::time_point time;
  std::vector<std::string> backtrace;
};

void write_error_record(const std::filesystem::path& path, const ErrorRecord& record);
// std::nullopt when the file is missing or unreadable (a rank can die while writing it).
std::optional<ErrorRecord> read_error_record(const std::filesystem::path& path);

// torchrun's error file (TORCHELASTIC_ERROR_FILE), as torch.distributed.elastic's @record
// writes it: {"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": ...,
// "timestamp": ...}}}. The type and message are split at the first ": ", the call stack
// becomes the backtrace, the time is the file's. std::nullopt as above.
std::optional<ErrorRecord> read_torchelastic_error(const std::filesystem::path& path);

}  // namespace sgpu::serialize
