#include "tracking/run_model.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include "tracking/ids.h"

namespace sgpu::tracking {
namespace {

std::mt19937_64& generator() {
  // Per thread, seeded from the OS: forked ranks must not share a sequence.
  thread_local std::mt19937_64 engine{[] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }()};
  return engine;
}

}  // namespace

const char* status_name(RunStatus status) {
  switch (status) {
    case RunStatus::kRunning:
      return "RUNNING";
    case RunStatus::kFinished:
      return "FINISHED";
    case RunStatus::kFailed:
      return "FAILED";
    case RunStatus::kKilled:
      return "KILLED";
  }
  return "RUNNING";
}

RunStatus status_from_name(std::string_view name) {
  for (RunStatus s : {RunStatus::kFinished, RunStatus::kFailed, RunStatus::kKilled}) {
    if (name == status_name(s)) return s;
  }
  return RunStatus::kRunning;
}

std::string current_user() {
  for (const char* var : {"LOGNAME", "USER", "LNAME", "USERNAME"}) {
    if (const char* value = std::getenv(var); value != nullptr && *value != '\0') return value;
  }
  if (const passwd* entry = ::getpwuid(::getuid())) return entry->pw_name;
  return "unknown";
}

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_hex(std::size_t digits) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  std::uniform_int_distribution<int> nibble(0, 15);
  for (std::size_t i = 0; i < digits; ++i) out += kHex[nibble(generator())];
  return out;
}

std::string random_experiment_id() {
  std::string out(1,
                  static_cast<char>('1' + std::uniform_int_distribution<int>(0, 8)(generator())));
  std::uniform_int_distribution<int> digit(0, 9);
  while (out.size() < 18) out += static_cast<char>('0' + digit(generator()));
  return out;
}

}  // namespace sgpu::tracking
