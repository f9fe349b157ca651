// One output stream of one rank: saved to its log file and streamed to the caller's
// console line by line with a "[rank N] " prefix.
//
// A console line is written with a single write() under a process-wide lock, so no line
// is ever split or mixed with another rank's, across calls too. A line is passed on whole
// up to kMaxLine bytes; a longer one is cut there, marked as cut, and the rest of it is
// left to the log file, which keeps every byte. The log file stops at the first write that
// fails (a full runs folder), said once on the caller's stderr; the console goes on.
#pragma once

#include <cstddef>
#include <deque>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "contract/rank_env.h"
#include "launcher/process.h"

namespace sgpu::launcher {

class LogStream {
 public:
  static constexpr std::size_t kMaxLine = 1 << 20;
  static constexpr std::size_t kTailLines = contract::kRankTailLines;

  // Takes each whole console line ("[rank N] " prefix and newline included).
  using Sink = std::function<void(std::string_view)>;

  // console_fd < 0: the file only.
  LogStream(UniqueFd source, int rank, const std::filesystem::path& file, int console_fd);
  // Console lines go to `sink` (a caller's own output, such as Python's sys.stdout), each
  // in one call, outside the console lock.
  LogStream(UniqueFd source, int rank, const std::filesystem::path& file, Sink sink);

  int fd() const { return source_.get(); }
  bool open() const { return static_cast<bool>(source_); }
  // Reads what is available; at end-of-file flushes the last partial line and closes.
  void pump();
  // Flushes and closes now (the writer may still hold the pipe).
  void close();
  // The last lines seen, oldest first, joined by '\n'.
  std::string tail() const;

 private:
  void emit(std::string_view line);
  void file_failed(int error);

  UniqueFd source_;
  UniqueFd file_;
  std::filesystem::path file_path_;
  int console_fd_;
  int rank_;
  Sink sink_;
  std::string prefix_;
  std::string pending_;
  bool cutting_ = false;  // the rest of a line cut at kMaxLine: up to its newline, dropped
  std::deque<std::string> tail_;
};

}  // namespace sgpu::launcher
