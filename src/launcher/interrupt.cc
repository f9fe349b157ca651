#include "launcher/interrupt.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace sgpu::launcher {
namespace {

// One per signal a scope can catch: how many scopes catch it, and what it did before.
struct CaughtSignal {
  int signal;
  int scopes = 0;
  struct sigaction previous {};
};

std::mutex scope_mutex;
CaughtSignal caught_interrupt{SIGINT};
CaughtSignal caught_terminate{SIGTERM};
std::atomic<int> received{0};

int make_event_fd() { return ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

void on_signal(int signal) {
  int expected = 0;
  received.compare_exchange_strong(expected, signal);
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(InterruptScope::event_fd(), &one, sizeof one);
}

// A signal the process ignores stays ignored: its calls go on as the process would.
void take(CaughtSignal& caught) {
  if (caught.scopes++ > 0) return;
  ::sigaction(caught.signal, nullptr, &caught.previous);
  if (caught.previous.sa_handler == SIG_IGN) return;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(caught.signal, &action, nullptr);
}

// The last scope catching the signal restores what it did before, then raises it again
// if it arrived.
void give_back(CaughtSignal& caught) {
  if (--caught.scopes > 0) return;
  ::sigaction(caught.signal, &caught.previous, nullptr);
  int expected = caught.signal;
  if (received.compare_exchange_strong(expected, 0)) {
    std::uint64_t drained = 0;
    [[maybe_unused]] ssize_t n = ::read(InterruptScope::event_fd(), &drained, sizeof drained);
    ::kill(::getpid(), caught.signal);
  }
}

}  // namespace

int InterruptScope::event_fd() {
  static const int fd = make_event_fd();
  return fd;
}

int InterruptScope::pending_signal() { return received.load(); }

bool InterruptScope::catches(int signal) const {
  return signal == SIGTERM ||
         (signal == SIGINT && caught_ == CaughtSignals::kInterruptAndTerminate);
}

InterruptScope::InterruptScope(CaughtSignals caught) : caught_(caught) {
  event_fd();  // created before any handler can need it
  std::lock_guard lock(scope_mutex);
  if (caught_ == CaughtSignals::kInterruptAndTerminate) take(caught_interrupt);
  take(caught_terminate);
}

InterruptScope::~InterruptScope() {
  std::lock_guard lock(scope_mutex);
  if (caught_ == CaughtSignals::kInterruptAndTerminate) give_back(caught_interrupt);
  give_back(caught_terminate);
}

}  // namespace sgpu::launcher
