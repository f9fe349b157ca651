// The launcher: steps 1-12 of a call (docs/architecture.md, "The life of one call").
//
// start_call and start_program check the options and the node, create the call's MLflow
// run and run folder, stage the call and start its ranks, then return a handle whose
// monitor thread streams output, watches exits, the deadline, signals and the caller,
// tears down on the first failure and gathers the results. Both throw ConfigError or
// AcceleratorMismatchError before anything starts. The public templates reach them
// through the seam in sgpu/internal/call.h (src/facade/call.cc).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "launcher/call_plan.h"
#include "launcher/front.h"
#include "sgpu/internal/call.h"
#include "sgpu/internal/call_record.h"
#include "sgpu/options.h"

namespace sgpu::launcher {

// A distributed function's call: every rank runs `record`'s function.
std::shared_ptr<detail::Call> start_call(const Options& options, serialize::CallRecord record);

// `command` (a program and its arguments, found on PATH) as every rank; success is every
// rank exiting 0.
std::shared_ptr<detail::Call> start_program(const Options& options,
                                            std::vector<std::string> command);

// A worker's call (front.h): every rank runs `call.command`, which speaks the record protocol.
std::shared_ptr<detail::Call> start_worker_call(const Options& options, WorkerCall call);

}  // namespace sgpu::launcher
