// One call's ranks watched from start to the last byte of their output: the monitor loop.
//
// It learns of exits from the RankStarter, streams output, and decides how the call ends
// (the Verdict): the first rank to fail on its own, the call's deadline, a cancel, a caught
// signal, the hang watchdog or another node decides it, and teardown follows the
// TeardownPlan. What a rank's success means, what is written down before teardown, and
// what the other nodes say come from the call through MonitorHooks; signals go through the
// starter, so the whole loop runs with a fake starter and no process.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "contract/run_folder.h"
#include "launcher/call_end.h"
#include "launcher/interrupt.h"
#include "launcher/log_stream.h"
#include "launcher/process.h"
#include "launcher/rank_starter.h"

namespace sgpu::launcher {

using Clock = std::chrono::steady_clock;
using WallClock = std::chrono::system_clock;

// One rank of this node: where it is, and what the monitor learned of its process.
struct RankSlot {
  int rank = 0;        // global: node_rank * gpus + local_rank
  int local_rank = 0;  // on this node
  int device_index = 0;
  contract::RankFolder folder;  // rank-<N>/
  pid_t pid = 0;                // 0: never started
  std::unique_ptr<LogStream> out;
  std::unique_ptr<LogStream> err;
  std::optional<ExitStatus> exit;
  WallClock::time_point exit_time;
  bool exited_in_teardown = false;
  bool timed_out = false;  // still running at the call's deadline
};

// reproc's stop actions: SIGTERM, `grace` to exit, then SIGKILL to the rank's tree; once
// every rank has exited, output is read until it closes or `drain` has passed.
struct TeardownPlan {
  std::chrono::milliseconds grace{0};
  std::chrono::milliseconds drain{1000};
};

struct Deadlines {
  Clock::time_point call = Clock::time_point::max();     // the call's timeout
  Clock::duration watch_every = Clock::duration::max();  // MonitorHooks::hung(); max: never
  Clock::duration peers_every = Clock::duration::max();  // MonitorHooks::peer_failure()
};

// How the call ended, as the monitor saw it.
struct Verdict {
  Outcome outcome = Outcome::kRunning;
  std::string reason;  // a cancel's ("interrupted by SIGINT"), another node's, a start's
  std::optional<WallClock::time_point> teardown_began;
};

// What the call tells the monitor, and what it hears from it.
class MonitorHooks {
 public:
  virtual ~MonitorHooks() = default;
  // Whether a rank that exited on its own succeeded.
  virtual bool exited_ok(const RankSlot& slot) const = 0;
  // The call is going wrong (`why`): what the ranks show now, before teardown changes it.
  virtual void diagnose(Outcome /*why*/) {}
  // Asked every Deadlines::watch_every while the ranks run.
  virtual bool hung() { return false; }
  // Asked every pass while there are other nodes: their failure, if one came.
  virtual std::optional<std::string> peer_failure() { return std::nullopt; }
  // Every pass of a teardown this node began (not a success, not another node's failure).
  virtual void tell_peers(const Verdict& /*verdict*/) {}
};

class Monitor {
 public:
  // `cancel_fd` becomes readable on cancel(); `interrupts` says which signals end the call.
  Monitor(RankStarter& starter, std::vector<RankSlot>& slots, MonitorHooks& hooks, int cancel_fd,
          const InterruptScope& interrupts);

  // The ranks could not all be started: those that were are torn down, and the call ends
  // kStartFailed with `why`.
  void start_failed(std::string why);

  // Until every rank has exited and its output is read; then every group is killed and
  // reaped and the output streams closed.
  Verdict run(const Deadlines& deadlines, const TeardownPlan& teardown);

 private:
  // NOTE [The monitor's phases]
  // The loop moves through these phases in order, skipping the ones it does not need;
  // `phase_` is the one it is in and `phase_until_` when that phase's wait ends.
  //   kRunning      the ranks run and their output streams. The first failure of a rank of
  //                 its own, the deadline, cancel, a signal, a hang or another node decides
  //                 the Outcome and sends SIGTERM to every live rank's group: kTerminating.
  //   kTerminating  until the grace has passed; then SIGKILL to what is left: kKilling.
  //   kKilling      until the starter reports the last exit.
  //   kDraining     every rank has exited, in whatever phase (a call that succeeds comes
  //                 straight from kRunning): every group gets SIGKILL once, since what the
  //                 ranks started may still hold their output open, and output is read
  //                 until it closes or the drain limit has passed: kDone.
  enum class Phase { kRunning, kTerminating, kKilling, kDraining, kDone };

  void enter(Phase phase, Clock::time_point until = Clock::time_point::max());
  // Decides the verdict (when still running) and begins the teardown.
  void end_as(Outcome outcome, std::string reason, Clock::time_point now, bool diagnose);
  bool all_ranks_exited() const;
  bool output_open() const;
  // One poll over what may wake the loop; fds[0] is the cancel fd.
  std::vector<pollfd> poll_once(const Deadlines& deadlines, Clock::time_point next_watch) const;
  void take_exits(Clock::time_point now);
  void close_out();

  RankStarter& starter_;
  std::vector<RankSlot>& slots_;
  MonitorHooks& hooks_;
  const int cancel_fd_;
  const InterruptScope& interrupts_;
  TeardownPlan teardown_;
  Verdict verdict_;
  Phase phase_ = Phase::kRunning;
  Clock::time_point phase_until_ = Clock::time_point::max();
};

}  // namespace sgpu::launcher
