#include "tracking/run_model.h"

#include <pwd.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "tracking/ids.h"

namespace sgpu::tracking {
namespace {

// Bytes from the OS's generator, each time, as MLflow's uuid4() takes them: a process
// state (a seeded engine) is copied by fork(), and a forked caller then repeated its
// parent's run ids.
void random_bytes(unsigned char* out, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(out, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("sgpu: cannot draw a random id: ") +
                               std::strerror(errno));
    }
    out += got;
    n -= static_cast<std::size_t>(got);
  }
}

// A number in [0, bound), without the modulo's bias.
unsigned uniform(unsigned bound) {
  const unsigned limit = 256 - 256 % bound;
  unsigned char byte = 0;
  do {
    random_bytes(&byte, 1);
  } while (byte >= limit);
  return byte % bound;
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
  std::string bytes((digits + 1) / 2, '\0');
  random_bytes(reinterpret_cast<unsigned char*>(bytes.data()), bytes.size());
  std::string out;
  for (std::size_t i = 0; i < digits; ++i) {
    const auto byte = static_cast<unsigned char>(bytes[i / 2]);
    out += kHex[i % 2 == 0 ? byte >> 4 : byte & 0xf];
  }
  return out;
}

std::string random_experiment_id() {
  std::string out(1, static_cast<char>('1' + uniform(9)));
  while (out.size() < 18) out += static_cast<char>('0' + uniform(10));
  return out;
}

}  // namespace sgpu::tracking
