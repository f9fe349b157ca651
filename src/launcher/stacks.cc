#include "launcher/stacks.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "contract/atomic_file.h"
#include "contract/stack_dump.h"
#include "rank/symbols.h"

namespace sgpu::launcher {
namespace {

namespace fs = std::filesystem;

// How long the ranks' threads have to dump their stacks, and how much of the culprit's
// the error quotes.
constexpr auto kStackLimit = std::chrono::milliseconds(1500);
constexpr std::size_t kQuotedFrames = 24;
constexpr std::size_t kQuotedWidth = 160;  // characters of a frame

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<pid_t> threads_of(pid_t pid) {
  std::vector<pid_t> tids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") == std::string::npos) {
      tids.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  std::sort(tids.begin(), tids.end());
  // The main thread first.
  std::stable_partition(tids.begin(), tids.end(), [pid](pid_t tid) { return tid == pid; });
  return tids;
}

// The rank's mapped files: each range with its file and where the file is loaded.
struct Mapping {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::string path;
};

struct AddressSpace {
  std::vector<Mapping> mappings;
  std::map<std::string, std::uint64_t> base;  // where each file's offset 0 is mapped
};

AddressSpace address_space(pid_t pid) {
  AddressSpace space;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, path;
    fields >> range >> perms >> offset >> device >> inode;
    std::getline(fields >> std::ws, path);
    if (path.empty() || path[0] != '/') continue;
    Mapping m;
    const auto dash = range.find('-');
    m.start = std::stoull(range.substr(0, dash), nullptr, 16);
    m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    m.path = path;
    if (std::stoull(offset, nullptr, 16) == 0 && !space.base.count(path))
      space.base[path] = m.start;
    space.mappings.push_back(std::move(m));
  }
  return space;
}

class Symbolizer {
 public:
  // "function (module)", or "0x... (module+0x...)" when the module names nothing there.
  std::string frame(const AddressSpace& space, std::uint64_t address, bool return_address) {
    const auto it =
        std::find_if(space.mappings.begin(), space.mappings.end(),
                     [&](const Mapping& m) { return address >= m.start && address < m.end; });
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(address));
    if (it == space.mappings.end()) return std::string(hex);
    const std::string module = fs::path(it->path).filename();
    auto& table = tables_[it->path];
    if (!table) table = rank::SymbolTable::load(it->path);
    const auto base = space.base.count(it->path) ? space.base.at(it->path) : it->start;
    const std::uint64_t at = table->relocatable() ? address - base : address;
    // A return address is just past its call: look up the call itself.
    const std::string name = table->name_at(return_address && at > 0 ? at - 1 : at);
    if (!name.empty()) return rank::demangle(name) + " (" + module + ")";
    char offset[32];
    std::snprintf(offset, sizeof offset, "+0x%llx", static_cast<unsigned long long>(at));
    return std::string(hex) + " (" + module + offset + ")";
  }

 private:
  std::map<std::string, std::shared_ptr<const rank::SymbolTable>> tables_;
};

struct Pending {
  RankStacks stacks;
  AddressSpace space;  // read when signalled: a rank that exits meanwhile takes its map along
  fs::path dir;
  bool python = false;
  fs::path python_file;  // contract::python_stacks_file
  std::uintmax_t python_size = 0;
  bool python_done = false;
};

// True once a thread can no longer answer: it, or its whole process, has ended.
bool gone(pid_t pid, pid_t tid) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
  const std::string stat = read_text(task + "/stat");
  const auto state = stat.rfind(')');
  return stat.empty() || (state != std::string::npos && state + 2 < stat.size() &&
                          (stat[state + 2] == 'Z' || stat[state + 2] == 'X'));
}

bool all_answered(std::vector<Pending>& pending) {
  bool done = true;
  for (Pending& p : pending) {
    for (ThreadStack& t : p.stacks.threads) {
      if (!t.answered) t.answered = fs::exists(p.dir / std::to_string(t.tid));
      done = done && (t.answered || gone(p.stacks.pid, t.tid));
    }
    if (p.python && !p.python_done) {
      // faulthandler writes as it goes: done once the file has stopped growing.
      std::error_code ec;
      const std::uintmax_t size = fs::file_size(p.python_file, ec);
      p.python_done =
          (!ec && size > 0 && size == p.python_size) || gone(p.stacks.pid, p.stacks.pid);
      p.python_size = ec ? 0 : size;
      done = done && p.python_done;
    }
  }
  return done;
}

}  // namespace

pid_t live_parent(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const auto end = stat.rfind(')');
  if (end == std::string::npos) return 0;
  std::istringstream fields(stat.substr(end + 1));
  std::string state;
  pid_t parent = 0;
  fields >> state >> parent;
  return state == "Z" || state == "X" ? 0 : parent;
}

std::vector<RankStacks> take_stacks(const std::vector<StackTarget>& targets,
                                    std::chrono::milliseconds limit) {
  std::vector<Pending> pending;
  for (const StackTarget& target : targets) {
    Pending p;
    p.stacks.rank = target.rank;
    p.stacks.pid = target.pid;
    p.dir = contract::stacks_dir(target.rank_dir);
    p.python = target.python;
    p.python_file = contract::python_stacks_file(target.rank_dir);
    std::error_code ec;
    // An earlier dump's files go; faulthandler's own file stays open in the rank.
    for (const auto& entry : fs::directory_iterator(p.dir, ec)) {
      const fs::path name = entry.path().filename();
      if (name != contract::python_stacks_file({}).filename() &&
          name != contract::program_pid_file({}).filename()) {
        fs::remove(entry.path(), ec);
      }
    }
    for (pid_t tid : threads_of(target.pid)) {
      if (::syscall(SYS_tgkill, target.pid, tid, contract::native_stack_signal()) != 0) continue;
      ThreadStack thread;
      thread.tid = tid;
      thread.name = read_text("/proc/" + std::to_string(target.pid) + "/task/" +
                              std::to_string(tid) + "/comm");
      if (!thread.name.empty() && thread.name.back() == '\n') thread.name.pop_back();
      p.stacks.threads.push_back(std::move(thread));
    }
    if (p.python) ::syscall(SYS_tgkill, target.pid, target.pid, contract::python_stack_signal());
    p.space = address_space(target.pid);
    pending.push_back(std::move(p));
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!all_answered(pending) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Symbolizer symbols;
  std::vector<RankStacks> taken;
  for (Pending& p : pending) {
    const AddressSpace& space = p.space;
    for (ThreadStack& thread : p.stacks.threads) {
      if (!thread.answered) continue;
      std::istringstream lines(read_text(p.dir / std::to_string(thread.tid)));
      std::vector<std::string> frames;
      for (std::string line; std::getline(lines, line);) {
        if (line.empty()) continue;
        const std::uint64_t address = std::stoull(line, nullptr, 16);
        frames.push_back(symbols.frame(space, address, !frames.empty()));
      }
      // The dump itself: the handler, then the kernel's signal return (libc's
      // __restore_rt, which has no symbol of its own).
      if (!frames.empty() && frames[0].find("on_stack_signal") != std::string::npos) {
        frames.erase(frames.begin(), frames.begin() + std::min<std::size_t>(2, frames.size()));
      }
      thread.frames = std::move(frames);
    }
    if (p.python) p.stacks.python = read_text(p.python_file);
    taken.push_back(std::move(p.stacks));
  }
  return taken;
}

std::string format_stacks(const RankStacks& stacks, std::size_t max_frames, std::size_t max_width) {
  std::string text =
      "rank " + std::to_string(stacks.rank) + " (pid " + std::to_string(stacks.pid) + "):\n";
  for (const ThreadStack& thread : stacks.threads) {
    text += "  thread " + std::to_string(thread.tid) + " (" + thread.name + ")";
    if (!thread.answered) {
      text += ": did not answer (it ended, blocks the signal, or is stopped)\n";
      continue;
    }
    text += ":\n";
    for (std::size_t i = 0; i < thread.frames.size() && i < max_frames; ++i) {
      const std::string& frame = thread.frames[i];
      text += "    #" + std::to_string(i) + " " +
              (frame.size() > max_width ? frame.substr(0, max_width) + "..." : frame) + "\n";
    }
    if (thread.frames.size() > max_frames) {
      text += "    ... " + std::to_string(thread.frames.size() - max_frames) + " more\n";
    }
  }
  if (!stacks.python.empty()) {
    text += "  Python:\n";
    std::istringstream lines(stacks.python);
    for (std::string line; std::getline(lines, line);) text += "    " + line + "\n";
  }
  return text;
}

void report_stacks(const std::vector<StackTarget>& targets, const std::filesystem::path& file,
                   CollectiveDiagnosis& into) {
  if (targets.empty()) return;
  const std::vector<RankStacks> stacks = take_stacks(targets, kStackLimit);
  std::string all;
  for (const RankStacks& rank : stacks) all += format_stacks(rank) + "\n";
  try {
    contract::write_file_atomically(file, all);
    into.stacks = file;
  } catch (const std::exception&) {
  }
  for (int culprit : into.culprits) {
    for (const RankStacks& rank : stacks) {
      if (rank.rank != culprit || rank.threads.empty()) continue;
      RankStacks main_thread = rank;
      main_thread.threads.resize(1);
      into.culprit_stack = format_stacks(main_thread, kQuotedFrames, kQuotedWidth);
      return;
    }
  }
}

std::string stacks_text(const CollectiveDiagnosis& diagnosis) {
  std::string text;
  if (!diagnosis.culprit_stack.empty()) {
    text += "\nthe stack of " + diagnosis.culprit_stack;
    text.pop_back();
  }
  if (!diagnosis.stacks.empty()) text += "\nevery live rank's stacks: " + diagnosis.stacks.string();
  return text;
}

}  // namespace sgpu::launcher
