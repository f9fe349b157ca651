// Ctrl-C and SIGTERM in the caller while calls are running.
//
// While at least one call that catches a signal runs, that signal is caught: every running
// call that catches it sees event_fd() become readable, tears its ranks down and ends as
// cancelled. When the last call catching it has finished, the previous disposition is
// restored and the signal is raised again, so the caller ends (or runs its own handler)
// exactly as it would have. A signal the caller ignores (SIG_IGN) is left ignored.
//
// A C++ caller and `sgpu run` catch both signals. Python catches SIGTERM only: its SIGINT is
// KeyboardInterrupt, on which sgpu.Handle cancels the call itself, while SIGTERM's default
// would end the interpreter at once, leaving the call's run RUNNING and its ranks' last
// words unsaved.
#pragma once

namespace sgpu::launcher {

enum class CaughtSignals { kInterruptAndTerminate, kTerminateOnly };

class InterruptScope {
 public:
  explicit InterruptScope(CaughtSignals caught = CaughtSignals::kInterruptAndTerminate);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // Whether this scope catches `signal` (false for 0).
  bool catches(int signal) const;

  // Readable once a signal arrived (never drained).
  static int event_fd();
  // The signal that arrived, or 0.
  static int pending_signal();

 private:
  CaughtSignals caught_;
};

}  // namespace sgpu::launcher
