// Every live rank's stacks, taken while the call still runs (NOTE [Stack dumps]): each
// thread's native frames with function names, and a Python rank's Python tracebacks.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "sgpu/errors.h"

namespace sgpu::launcher {

struct StackTarget {
  int rank = 0;
  pid_t pid = 0;
  std::filesystem::path rank_dir;
  bool python = false;  // also take its Python tracebacks
};

struct ThreadStack {
  pid_t tid = 0;
  std::string name;                 // the thread's comm
  std::vector<std::string> frames;  // innermost first: "sgpu::sim::act(...) (hang_test)"
  bool answered = false;            // false: it did not dump within the limit
};

struct RankStacks {
  int rank = 0;
  pid_t pid = 0;
  std::vector<ThreadStack> threads;  // the main thread first
  std::string python;                // faulthandler's text; "" for a C++ rank
};

// The parent of a live process; 0 when it is gone or a zombie.
pid_t live_parent(pid_t pid);

// Signals every thread of every target at once and waits at most `limit` for all of them.
std::vector<RankStacks> take_stacks(const std::vector<StackTarget>& targets,
                                    std::chrono::milliseconds limit);

// A rank's stacks as text: a header per thread, then its frames; `max_frames` a thread,
// each cut to `max_width` characters.
std::string format_stacks(const RankStacks& stacks, std::size_t max_frames = 64,
                          std::size_t max_width = std::string::npos);

// Takes every target's stacks, writes them all to `file` (stacks.txt) and quotes the main
// thread of the diagnosis's first culprit that answered: `into`'s stacks and culprit_stack,
// as a hang's error shows them. Nothing without targets.
void report_stacks(const std::vector<StackTarget>& targets, const std::filesystem::path& file,
                   CollectiveDiagnosis& into);

// What a diagnosis says of the stacks, after its table: "\nthe stack of rank 1 ...\nevery
// live rank's stacks: FILE"; "" when none were taken.
std::string stacks_text(const CollectiveDiagnosis& diagnosis);

}  // namespace sgpu::launcher
