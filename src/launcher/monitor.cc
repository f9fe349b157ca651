#include "launcher/monitor.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cstdint>

#include "launcher/failure_table.h"

namespace sgpu::launcher {

Monitor::Monitor(RankStarter& starter, std::vector<RankSlot>& slots, MonitorHooks& hooks,
                 int cancel_fd, const InterruptScope& interrupts)
    : starter_(starter),
      slots_(slots),
      hooks_(hooks),
      cancel_fd_(cancel_fd),
      interrupts_(interrupts) {}

void Monitor::start_failed(std::string why) {
  verdict_.outcome = Outcome::kStartFailed;
  verdict_.reason = std::move(why);
}

void Monitor::enter(Phase phase, Clock::time_point until) {
  phase_ = phase;
  phase_until_ = until;
}

void Monitor::end_as(Outcome outcome, std::string reason, Clock::time_point now, bool diagnose) {
  if (phase_ != Phase::kRunning) return;
  verdict_.outcome = outcome;
  verdict_.reason = std::move(reason);
  if (diagnose) hooks_.diagnose(outcome);
  verdict_.teardown_began = WallClock::now();
  enter(Phase::kTerminating, now + teardown_.grace);
  for (RankSlot& slot : slots_) {
    if (slot.pid > 0 && !slot.exit) starter_.signal(slot.pid, SIGTERM);
  }
}

bool Monitor::all_ranks_exited() const {
  return std::all_of(slots_.begin(), slots_.end(),
                     [](const RankSlot& s) { return s.pid == 0 || s.exit.has_value(); });
}

bool Monitor::output_open() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const RankSlot& s) {
    return (s.out && s.out->open()) || (s.err && s.err->open());
  });
}

std::vector<pollfd> Monitor::poll_once(const Deadlines& deadlines,
                                       Clock::time_point next_watch) const {
  const Clock::time_point now = Clock::now();
  std::vector<pollfd> fds;
  fds.push_back({cancel_fd_, POLLIN, 0});
  // The signal fd stays readable once a signal came, so it is watched only while the call
  // runs, and not once the signal that came is one this call leaves to the caller (caught
  // by another call in this process that catches more).
  const int pending = InterruptScope::pending_signal();
  const bool watch_signals =
      phase_ == Phase::kRunning && (pending == 0 || interrupts_.catches(pending));
  fds.push_back({watch_signals ? InterruptScope::event_fd() : -1, POLLIN, 0});
  for (const RankSlot& slot : slots_) {
    if (slot.out && slot.out->open()) fds.push_back({slot.out->fd(), POLLIN, 0});
    if (slot.err && slot.err->open()) fds.push_back({slot.err->fd(), POLLIN, 0});
  }
  starter_.add_poll_fds(fds);
  const Clock::time_point wake =
      phase_ == Phase::kRunning ? std::min(deadlines.call, next_watch) : phase_until_;
  long long timeout_ms = -1;
  if (wake != Clock::time_point::max()) {
    timeout_ms = std::clamp<long long>(
        std::chrono::ceil<std::chrono::milliseconds>(wake - now).count(), 0, 60'000);
  }
  if (deadlines.peers_every != Clock::duration::max()) {
    const auto every = std::chrono::ceil<std::chrono::milliseconds>(deadlines.peers_every).count();
    if (timeout_ms < 0 || timeout_ms > every) timeout_ms = every;
  }
  ::poll(fds.data(), fds.size(), static_cast<int>(timeout_ms));
  return fds;
}

void Monitor::take_exits(Clock::time_point now) {
  for (const RankExit& exit : starter_.collect_exits()) {
    const auto slot = std::find_if(slots_.begin(), slots_.end(),
                                   [&](const RankSlot& s) { return s.pid == exit.pid; });
    if (slot == slots_.end() || slot->exit) continue;
    slot->exit = exit.status;
    slot->exit_time = WallClock::now();
    slot->exited_in_teardown = verdict_.teardown_began.has_value();
    if (phase_ == Phase::kRunning && !hooks_.exited_ok(*slot)) {
      end_as(Outcome::kRankFailed, "", now, true);
    }
  }
}

Verdict Monitor::run(const Deadlines& deadlines, const TeardownPlan& teardown) {
  teardown_ = teardown;
  if (verdict_.outcome == Outcome::kStartFailed) {
    std::string why = std::move(verdict_.reason);
    end_as(Outcome::kStartFailed, std::move(why), Clock::now(), false);
  }
  const bool watches = deadlines.watch_every != Clock::duration::max();
  const bool has_peers = deadlines.peers_every != Clock::duration::max();
  Clock::time_point next_watch =
      watches ? Clock::now() + deadlines.watch_every : Clock::time_point::max();
  while (true) {
    Clock::time_point now = Clock::now();
    if (phase_ < Phase::kDraining && all_ranks_exited()) {
      if (verdict_.outcome == Outcome::kRunning) verdict_.outcome = Outcome::kSucceeded;
      for (RankSlot& slot : slots_) {
        if (slot.pid > 0) starter_.signal(slot.pid, SIGKILL);
      }
      enter(Phase::kDraining, now + teardown_.drain);
    }
    if (phase_ == Phase::kDraining && (!output_open() || now >= phase_until_)) break;

    const std::vector<pollfd> fds = poll_once(deadlines, next_watch);
    now = Clock::now();
    for (RankSlot& slot : slots_) {
      if (slot.out) slot.out->pump();
      if (slot.err) slot.err->pump();
    }
    take_exits(now);
    if (fds[0].revents & POLLIN) end_as(Outcome::kCancelled, "cancelled", now, false);
    if (const int signal = InterruptScope::pending_signal(); interrupts_.catches(signal)) {
      end_as(Outcome::kCancelled, "interrupted by " + signal_name(signal), now, false);
    }
    if (phase_ == Phase::kRunning && now >= deadlines.call) {
      for (RankSlot& slot : slots_) slot.timed_out = !slot.exit.has_value();
      end_as(Outcome::kTimedOut, "", now, true);
    }
    if (phase_ == Phase::kRunning && watches && now >= next_watch) {
      next_watch = now + deadlines.watch_every;
      if (hooks_.hung()) end_as(Outcome::kHung, "", now, true);
    }
    if (has_peers) {
      std::optional<std::string> elsewhere = hooks_.peer_failure();
      if (phase_ == Phase::kRunning && elsewhere) {
        end_as(Outcome::kPeerFailed, std::move(*elsewhere), now, false);
      } else if (phase_ != Phase::kRunning && verdict_.outcome != Outcome::kPeerFailed &&
                 verdict_.outcome != Outcome::kSucceeded) {
        hooks_.tell_peers(verdict_);
      }
    }
    if (phase_ == Phase::kTerminating && now >= phase_until_) {
      for (RankSlot& slot : slots_) {
        if (slot.pid > 0 && !slot.exit) starter_.kill_tree(slot.pid);
      }
      enter(Phase::kKilling);
    }
  }
  enter(Phase::kDone);
  close_out();
  return verdict_;
}

void Monitor::close_out() {
  // Every group (grandchildren included) is gone before the zombies are reaped, so no
  // process group id can have been reused.
  for (RankSlot& slot : slots_) {
    if (slot.pid > 0) starter_.signal(slot.pid, SIGKILL);
  }
  starter_.release();
  for (RankSlot& slot : slots_) {
    if (slot.out) slot.out->close();
    if (slot.err) slot.err->close();
  }
}

}  // namespace sgpu::launcher
