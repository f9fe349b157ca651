// What a call's ranks run, and what their endings mean: one implementation per kind of rank.
//
//   function  a C++ function of this binary: each rank is this binary again (rank role),
//             reads call.bin, writes its result or error record (rank/rank_main.h);
//   program   `sgpu run`'s command: each rank is this binary in the program role, which
//             supervises the command; success is exit 0, and it returns nothing;
//   worker    a program that speaks the record protocol (python -m sgpu._worker), from its
//             own fork server where it has one; its results are the records' payloads.
//
// The call asks its RankProgram wherever the kinds differ: how ranks start, what is staged,
// how the run is named, whether an exit is a success, where an error record is and whether
// a live rank's stacks may be taken.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "contract/run_folder.h"
#include "launcher/front.h"
#include "launcher/monitor.h"
#include "launcher/process.h"
#include "launcher/rank_starter.h"
#include "launcher/stacks.h"
#include "serialize/error_record.h"
#include "sgpu/internal/call_record.h"
#include "sgpu/options.h"
#include "tracking/call_run.h"

namespace sgpu::launcher {

class RankProgram {
 public:
  using Variables = std::vector<std::pair<std::string, std::string>>;

  virtual ~RankProgram() = default;

  // What a rank is told it is: one of contract/rank_env.h's roles.
  virtual const char* role() const = 0;
  // ConfigErrors this kind of call has before anything starts (after the options' own),
  // naming settings as `front_end` does; `computes_shapes`: the backend's ranks compute
  // shapes without data (Backend::computes_shapes).
  virtual void check(bool computes_shapes, FrontEnd front_end) const {}
  // Bytes staged for the ranks, checked against Options::max_payload_bytes.
  virtual std::size_t payload_bytes() const { return 0; }
  // Whether its ranks may fork from a warm server (else every rank is exec'd).
  virtual bool forks() const = 0;
  // How its ranks come to be under `method`.
  virtual std::unique_ptr<RankStarter> starter(StartMethod method, bool serves_cuda) const;
  // The call in its run folder before any rank starts (call.bin). Throws std::system_error.
  virtual void stage(const contract::RunFolder& folder, std::size_t max_payload_bytes) = 0;
  // The call's run: its name (when Options::name is empty) and its function parameter.
  virtual void name_run(tracking::CallRunRequest& request) const = 0;
  // What errors call it: the function's name, or the program's.
  virtual std::string label() const = 0;

  // What each rank starts as (program and argv; the call fills in the rest).
  virtual SpawnRequest spawn() const = 0;
  // Variables of this kind's own, set over the contract's.
  virtual void add_environment(const RankSlot& /*slot*/, Variables& /*vars*/) const {}
  // Whether a rank that exited on its own succeeded.
  virtual bool exited_ok(const RankSlot& slot) const;
  // Whether its ranks return results to the caller.
  virtual bool returns_results() const { return true; }
  // Whether the collectives' and compute lines are printed at the end of every call, or
  // only when the ranks ran in shape-only compute, whose figures are the point.
  virtual bool always_prints_figures() const { return true; }
  // The rank's record of its own failure, if it wrote one.
  virtual std::optional<serialize::ErrorRecord> error_record(const RankSlot& slot) const;
  // Where a live rank's stacks are asked for (NOTE [Stack dumps]); nullopt: nowhere.
  virtual std::optional<StackTarget> stack_target(const RankSlot& slot) const = 0;
};

// A distributed function of this binary: `record` is its call.
std::unique_ptr<RankProgram> function_ranks(serialize::CallRecord record);
// `command` (a program and its arguments) under the program role.
std::unique_ptr<RankProgram> program_ranks(std::vector<std::string> command);
// A worker program's call: its command, name and fork server (the rest is the front
// end's), and `payload`, the call it stages.
std::unique_ptr<RankProgram> worker_ranks(const WorkerCall& call, std::string payload);

}  // namespace sgpu::launcher
