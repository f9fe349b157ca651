// One try of a call's ranks (docs/architecture.md, "The life of one call", steps 7-11): the
// ranks started as their RankProgram says, each with its environment, watched by the
// Monitor to a Verdict, the rings read and the stacks taken when it goes wrong, and what
// the ranks left: a row each, their results and their figures. The call (launcher.cc) holds
// the handle around it, and the other nodes are its Peers.
#pragma once

#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/selection.h"
#include "launcher/call_end.h"
#include "launcher/front.h"
#include "launcher/hang_diagnosis.h"
#include "launcher/interrupt.h"
#include "launcher/monitor.h"
#include "launcher/peers.h"
#include "launcher/rank_program.h"
#include "launcher/rank_starter.h"
#include "sgpu/comm.h"
#include "sgpu/compute.h"
#include "sgpu/memory.h"
#include "sgpu/options.h"

namespace sgpu::launcher {

// What a call gives each try of its ranks: the plan (call_plan.h) and where it runs.
struct CallSetup {
  std::unique_ptr<RankProgram> program;  // what the ranks run
  Options options;
  ConsoleSink console;  // unset: the caller's fds 1 and 2
  CaughtSignals caught_signals = CaughtSignals::kInterruptAndTerminate;
  std::string backend;
  std::vector<std::string> backend_env;
  backend::Selection selection;
  StartMethod method = StartMethod::kForkServer;
  std::filesystem::path run_dir;
  Timeout hang_timeout;  // nullopt: never judged hung
  int folded_nodes = 1;  // CallPlan::folded_nodes
};

// Each rank's figures at its end, by slot.
struct RankFigures {
  std::vector<MemoryStats> memory;
  std::vector<CommStats> comm;
  std::vector<ComputeStats> compute;
};

class Attempt final : private MonitorHooks {
 public:
  // `tracking_env`: what the call's run tells each rank (CallRun::rank_environment).
  Attempt(const CallSetup& call, Peers& peers, RankStarter& starter,
          std::vector<std::pair<std::string, std::string>> tracking_env);

  // Starts the ranks and watches them until they are gone (`cancel_fd` readable: cancel;
  // `interrupts`: the caller's signals that end the call, caught by the call for as long as
  // it runs, its run's end included).
  Verdict run(int cancel_fd, const InterruptScope& interrupts);

  // What the try's error is made of (call_end.h) for `outcome`: every rank's row, the other
  // nodes' too.
  CallEnd call_end(Outcome outcome, std::string reason) const;
  // What this node's ranks left, for the other nodes (Peers::exchange).
  NodeEnd node_end(bool read_results) const;
  // Each rank's result in rank order into `results`; a result that cannot be read fails the
  // call as that rank's, with `end`'s rows. Returns that error, or none.
  std::exception_ptr read_results(CallEnd& end, std::vector<std::string>& results) const;
  RankFigures figures() const;
  // A folded world whose second of a place did not call what its first called: the call's
  // error (NOTE [A folded world] in sim/fold.h); none where alike or not folded.
  std::exception_ptr folding_unheld() const;
  // The lines that end a call's output: what a folded world stood for, the communication,
  // the compute estimate and, in shape-only compute, each rank's peak memory; none where no
  // rank shows on the console.
  std::vector<std::string> summary_lines(bool held, const RankFigures& figures, bool always) const;
  std::size_t ranks() const { return slots_.size(); }

 private:
  bool exited_ok(const RankSlot& slot) const override { return call_.program->exited_ok(slot); }
  void diagnose(Outcome why) override;
  bool hung() override;
  std::optional<std::string> peer_failure() override { return peers_.failure(); }
  void tell_peers(const Verdict& verdict) override;

  std::vector<int> launched_ranks() const;
  void start_ranks();
  std::vector<std::string> rank_env(const RankSlot& slot) const;
  std::vector<RankView> rank_views() const;
  Diagnosis settled_diagnosis(Outcome why, std::vector<RankView>& views) const;
  void take_rank_stacks();
  RankFailure row_for(const RankSlot& slot) const;
  std::string result_of(const RankSlot& slot) const;
  std::vector<RankFailure> all_rows() const;
  std::string what_failed(const Verdict& verdict) const;
  bool shows_on_console(int rank) const;
  int world_size() const { return call_.options.gpus * world_nodes(); }
  // The world's nodes: the launch's, or those a folded launch stands for.
  int world_nodes() const { return peers_.plan().nnodes * call_.folded_nodes; }
  std::string folded_summary(bool held, const std::vector<MemoryStats>& memory) const;
  std::string folded_role(const RankSlot& slot) const;
  std::pair<std::size_t, std::size_t> folded_pair() const;
  std::string fold_setting() const;  // sim_fold, as the call's caller writes it

  const CallSetup& call_;
  Peers& peers_;
  RankStarter& starter_;
  const std::vector<std::pair<std::string, std::string>> tracking_env_;
  std::vector<RankSlot> slots_;
  CollectiveDiagnosis collectives_;  // what the rings said when the call went wrong
  Verdict verdict_;                  // the monitor's, once the ranks are gone
};

}  // namespace sgpu::launcher
