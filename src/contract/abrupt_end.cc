#include "contract/abrupt_end.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

namespace sgpu::contract {
namespace {

// Fixed storage: the note is written from signal handlers, which must not allocate.
char g_file[4096] = {0};

}  // namespace

void arm_abrupt_end(const std::filesystem::path& file) {
  const std::string text = file.string();
  if (text.size() >= sizeof g_file) return;  // such a path cannot be noted; nothing is armed
  std::memcpy(g_file, text.c_str(), text.size() + 1);
}

void note_abrupt_end() noexcept {
  if (g_file[0] == '\0') return;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const long long ns = static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec;
  char digits[32];
  int n = 0;
  for (long long v = ns; v > 0 && n < 31; v /= 10) digits[n++] = static_cast<char>('0' + v % 10);
  char text[33];
  for (int i = 0; i < n; ++i) text[i] = digits[n - 1 - i];
  text[n] = '\n';
  const int fd = ::open(g_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;  // noted already, or the folder is gone
  [[maybe_unused]] const ssize_t written = ::write(fd, text, static_cast<std::size_t>(n) + 1);
  ::close(fd);
}

std::optional<std::chrono::system_clock::time_point> read_abrupt_end(
    const std::filesystem::path& file) {
  std::ifstream in(file);
  long long ns = 0;
  if (!(in >> ns) || ns <= 0) return std::nullopt;
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(ns)));
}

}  // namespace sgpu::contract
