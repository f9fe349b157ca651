// A rank's side of the record protocol (NOTE [The run folder]), one for every kind of rank:
// a C++ function's (run_rank) and a worker program's (the native module's bindings). The
// rank reads its call, writes its result or its error, and ends (end_worker_rank, or
// run_rank's own end).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serialize/record.h"
#include "sgpu/options.h"

namespace sgpu::rank {

// The staged call (call.bin) as a record of `kind`.
std::string read_call(serialize::RecordKind kind);

// The rank's result; RecordTooLarge, with nothing written, over `limit`, its advice as
// `front_end` names the setting (too_large_advice).
void write_result(std::string_view result, std::size_t limit, FrontEnd front_end);

// What to do about a result over the limit, as `front_end` names the setting: "raise
// max_payload_bytes or return less" (Options::max_payload_bytes in C++).
std::string too_large_advice(FrontEnd front_end);

struct RankError {
  std::string type;  // "ValueError", "std::runtime_error"
  std::string message;
  std::vector<std::string> traceback;    // outermost first; empty where there is none
  std::optional<std::string> exception;  // the exception itself (pickled), when it can travel
};

// exception.bin first when there is one (the launcher takes error.json as the sign that
// the rank failed), then error.json with the rank and the time.
void write_error(RankError error);

}  // namespace sgpu::rank
