#include "launcher/log_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace sgpu::launcher {
namespace {

std::mutex& console_mutex() {
  static std::mutex mutex;
  return mutex;
}

// 0, or the errno of the write that failed.
int write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

}  // namespace

LogStream::LogStream(UniqueFd source, int rank, const std::filesystem::path& file, int console_fd)
    : source_(std::move(source)),
      file_(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600)),
      file_path_(file),
      console_fd_(console_fd),
      rank_(rank),
      prefix_("[rank " + std::to_string(rank) + "] ") {
  ::fcntl(source_.get(), F_SETFL, ::fcntl(source_.get(), F_GETFL) | O_NONBLOCK);
}

LogStream::LogStream(UniqueFd source, int rank, const std::filesystem::path& file, Sink sink)
    : LogStream(std::move(source), rank, file, -1) {
  sink_ = std::move(sink);
}

void LogStream::pump() {
  char buffer[16384];
  while (source_) {
    const ssize_t n = ::read(source_.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: nothing more for now
    if (n == 0) {
      close();
      return;
    }
    const std::string_view data(buffer, static_cast<std::size_t>(n));
    if (file_) {
      if (const int error = write_all(file_.get(), data); error != 0) file_failed(error);
    }
    std::string_view rest = data;
    if (cutting_) {  // what is left of a line already cut: to its newline, the file's only
      const std::size_t nl = rest.find('\n');
      if (nl == std::string_view::npos) continue;
      rest.remove_prefix(nl + 1);
      cutting_ = false;
    }
    pending_.append(rest);
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
      emit(std::string_view(pending_).substr(start, nl - start));
    }
    pending_.erase(0, start);
    if (pending_.size() > kMaxLine) {
      emit(pending_.substr(0, kMaxLine) + " [sgpu: line cut at " + std::to_string(kMaxLine >> 20) +
           " MiB; " + file_path_.filename().string() + " in the run folder has all of it]");
      cutting_ = true;  // pending_ holds no newline: the loop above took every one
      pending_.clear();
    }
  }
}

void LogStream::close() {
  if (!source_) return;
  source_.reset();
  if (!pending_.empty()) {
    emit(pending_);
    pending_.clear();
  }
  file_.reset();
}

void LogStream::emit(std::string_view line) {
  tail_.emplace_back(line);
  if (tail_.size() > kTailLines) tail_.pop_front();
  if (console_fd_ < 0 && !sink_) return;
  std::string out;
  out.reserve(prefix_.size() + line.size() + 1);
  out.append(prefix_).append(line).push_back('\n');
  if (sink_) {
    sink_(out);
    return;
  }
  std::lock_guard lock(console_mutex());
  write_all(console_fd_, out);  // a closed console must not stop the call
}

// The log stops at the first write that fails (a full runs folder, say), said once on the
// caller's stderr; the console keeps every line.
void LogStream::file_failed(int error) {
  file_.reset();
  const std::string text = "sgpu: rank " + std::to_string(rank_) + "'s log " + file_path_.string() +
                           " is incomplete from here: " + std::strerror(error) +
                           "; the console shows every line\n";
  std::lock_guard lock(console_mutex());
  write_all(STDERR_FILENO, text);
}

std::string LogStream::tail() const {
  std::string text;
  for (const std::string& line : tail_) {
    if (!text.empty()) text += '\n';
    text += line;
  }
  return text;
}

}  // namespace sgpu::launcher
