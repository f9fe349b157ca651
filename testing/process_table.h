// Looks at the process table, not at flags: which processes carry a marker in their
// environment, which rank processes are left unreaped, how many descriptors it holds.
#pragma once

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launcher/fork_server.h"
#include "sgpu/errors.h"

namespace sgpu::testing {

inline std::vector<pid_t> all_pids() {
  std::vector<pid_t> pids;
  if (DIR* dir = ::opendir("/proc")) {
    while (dirent* entry = ::readdir(dir)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
      if (pid > 0) pids.push_back(pid);
    }
    ::closedir(dir);
  }
  return pids;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A process's state, parent and process group, from /proc/PID/stat; std::nullopt when it
// is gone.
struct ProcessStat {
  char state = 0;
  pid_t ppid = 0;
  pid_t pgrp = 0;
};
inline std::optional<ProcessStat> stat_of(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');  // after "pid (comm) ": state, ppid, pgrp
  ProcessStat fields;
  int ppid = 0;
  int pgrp = 0;
  if (close == std::string::npos ||
      std::sscanf(stat.c_str() + close + 1, " %c %d %d", &fields.state, &ppid, &pgrp) != 3) {
    return std::nullopt;
  }
  fields.ppid = ppid;
  fields.pgrp = pgrp;
  return fields;
}

// Processes whose environment holds `marker` ("NAME=value"), leaving out this process and
// its fork server, which outlive calls by design.
inline std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> found;
  const std::string needle = marker + '\0';
  for (pid_t pid : all_pids()) {
    if (pid == ::getpid() || pid == launcher::fork_server_pid()) continue;
    const std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
    if (env.find(needle) != std::string::npos) found.push_back(pid);
  }
  return found;
}

// Live processes (zombies left out) that are one of `groups` or in the process group of
// one. A rank, started either way, leads a process group of its own, which what it starts
// joins: given a call's rank pids, this finds the ranks and what they left behind. Unlike
// processes_with, it sees ranks forked by the fork server, whose /proc/PID/environ is the
// server's, so a marker set after the server started is not in it.
inline std::vector<pid_t> alive_in_groups(const std::vector<pid_t>& groups) {
  std::vector<pid_t> found;
  for (pid_t pid : all_pids()) {
    const auto stat = stat_of(pid);
    if (!stat || stat->state == 'Z') continue;
    for (pid_t group : groups) {
      if (group > 0 && (pid == group || stat->pgrp == group)) {
        found.push_back(pid);
        break;
      }
    }
  }
  return found;
}

// The pids of a failed call's ranks, from its rows.
inline std::vector<pid_t> rank_pids(const DistributedError& error) {
  std::vector<pid_t> pids;
  for (const RankFailure& row : error.ranks()) pids.push_back(row.pid);
  return pids;
}

// Children of `parent`, zombies included.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> found;
  for (pid_t pid : all_pids()) {
    if (const auto stat = stat_of(pid); stat && stat->ppid == parent) found.push_back(pid);
  }
  return found;
}

// Whether `pid` is a sanitizer's symbolizer: ThreadSanitizer starts one as a child of the
// process at its first report, a suppressed one too, and keeps it to the end.
inline bool is_symbolizer(pid_t pid) {
  std::string comm = read_file("/proc/" + std::to_string(pid) + "/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm.rfind("llvm-symbolizer", 0) == 0 || comm == "addr2line";
}

// Rank processes not yet reaped, whoever their parent: children of this process other
// than its fork server and a sanitizer's symbolizer, and the fork server's children.
inline std::vector<pid_t> children() {
  std::vector<pid_t> found;
  const pid_t server = launcher::fork_server_pid();
  for (pid_t pid : children_of(::getpid())) {
    if (pid != server && !is_symbolizer(pid)) found.push_back(pid);
  }
  if (server != 0) {
    for (pid_t pid : children_of(server)) found.push_back(pid);
  }
  return found;
}

inline int open_fd_count() {
  int count = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] != '.') ++count;
    }
    ::closedir(dir);
  }
  return count - 1;  // the directory stream itself
}

// Polls `done` until it holds or `limit` passes; returns whether it held.
template <class Predicate>
bool eventually(Predicate done, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

}  // namespace sgpu::testing
