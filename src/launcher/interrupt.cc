#include "launcher/interrupt.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace sgpu::launcher {
namespace {

std::mutex scope_mutex;
int active_scopes = 0;
struct sigaction previous_int;
struct sigaction previous_term;
std::atomic<int> received{0};

int make_event_fd() { return ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

void on_signal(int signal) {
  int expected = 0;
  received.compare_exchange_strong(expected, signal);
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(InterruptScope::event_fd(), &one, sizeof one);
}

}  // namespace

int InterruptScope::event_fd() {
  static const int fd = make_event_fd();
  return fd;
}

int InterruptScope::pending_signal() { return received.load(); }

InterruptScope::InterruptScope() {
  event_fd();  // created before any handler can need it
  std::lock_guard lock(scope_mutex);
  if (active_scopes++ > 0) return;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, &previous_int);
  ::sigaction(SIGTERM, &action, &previous_term);
}

InterruptScope::~InterruptScope() {
  std::lock_guard lock(scope_mutex);
  if (--active_scopes > 0) return;
  ::sigaction(SIGINT, &previous_int, nullptr);
  ::sigaction(SIGTERM, &previous_term, nullptr);
  if (const int signal = received.exchange(0); signal != 0) {
    std::uint64_t drained = 0;
    [[maybe_unused]] ssize_t n = ::read(event_fd(), &drained, sizeof drained);
    ::kill(::getpid(), signal);
  }
}

}  // namespace sgpu::launcher
