// Ctrl-C and SIGTERM in the caller while calls are running.
//
// While at least one call runs, SIGINT and SIGTERM are caught: every running call sees
// event_fd() become readable, tears its ranks down and ends as cancelled. When the last
// running call has finished, the previous dispositions are restored and the signal is
// raised again, so the caller ends (or runs its own handler) exactly as it would have.
#pragma once

namespace sgpu::launcher {

class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // Readable once a signal arrived (never drained).
  static int event_fd();
  // The signal that arrived, or 0.
  static int pending_signal();
};

}  // namespace sgpu::launcher
