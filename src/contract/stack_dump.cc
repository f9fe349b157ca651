#include "contract/stack_dump.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

namespace sgpu::contract {
namespace {

char g_dir[PATH_MAX];  // rank-N/stacks/, with its slash
std::size_t g_dir_length = 0;

// Appends `value` in decimal (or hexadecimal, with 0x) to `out`; returns the new end.
char* put_number(char* out, std::uintptr_t value, unsigned base) {
  char digits[24];
  int n = 0;
  do {
    const unsigned digit = static_cast<unsigned>(value % base);
    digits[n++] = static_cast<char>(digit < 10 ? '0' + digit : 'a' + digit - 10);
    value /= base;
  } while (value != 0);
  if (base == 16) {
    *out++ = '0';
    *out++ = 'x';
  }
  while (n > 0) *out++ = digits[--n];
  return out;
}

// Async-signal-safe but for backtrace(), which the rank warms up before (its first call
// loads libgcc), as the crash handler does.
void on_stack_signal(int) {
  const int saved_errno = errno;
  void* frames[128];
  const int depth = ::backtrace(frames, 128);
  char text[128 * 20];
  char* end = text;
  for (int i = 0; i < depth; ++i) {
    end = put_number(end, reinterpret_cast<std::uintptr_t>(frames[i]), 16);
    *end++ = '\n';
  }
  char part[PATH_MAX + 32];
  char whole[PATH_MAX + 32];
  std::memcpy(part, g_dir, g_dir_length);
  char* name_end = put_number(part + g_dir_length, static_cast<std::uintptr_t>(::gettid()), 10);
  const std::size_t whole_length = static_cast<std::size_t>(name_end - part);
  std::memcpy(whole, part, whole_length);
  whole[whole_length] = '\0';
  std::memcpy(name_end, ".part", 6);
  const int fd = ::open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, text, static_cast<std::size_t>(end - text));
    ::close(fd);
    ::rename(part, whole);
  }
  errno = saved_errno;
}

}  // namespace

int native_stack_signal() { return SIGRTMIN + 4; }
int python_stack_signal() { return SIGRTMIN + 5; }

std::filesystem::path stacks_dir(const std::filesystem::path& rank_dir) {
  return rank_dir / "stacks";
}

std::filesystem::path program_pid_file(const std::filesystem::path& rank_dir) {
  return stacks_dir(rank_dir) / "program.pid";
}

std::filesystem::path python_stacks_file(const std::filesystem::path& rank_dir) {
  return stacks_dir(rank_dir) / "python";
}

void arm_stack_dump(const std::filesystem::path& rank_dir) {
  if (rank_dir.empty()) return;
  const std::string dir = stacks_dir(rank_dir).string() + "/";
  if (dir.size() >= sizeof g_dir) return;
  ::mkdir(stacks_dir(rank_dir).c_str(), 0700);
  std::memcpy(g_dir, dir.c_str(), dir.size() + 1);
  g_dir_length = dir.size();
  void* warm[1];
  ::backtrace(warm, 1);
  struct sigaction action {};
  action.sa_handler = on_stack_signal;
  action.sa_flags = SA_RESTART;
  ::sigaction(native_stack_signal(), &action, nullptr);
}

}  // namespace sgpu::contract
