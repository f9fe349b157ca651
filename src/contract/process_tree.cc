#include "contract/process_tree.h"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <system_error>

namespace sgpu::contract {
namespace {

// Every process's parent, from /proc/PID/stat.
std::map<pid_t, pid_t> parents() {
  std::map<pid_t, pid_t> parent_of;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const auto close = line.rfind(')');  // after "pid (comm) ": state, ppid
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (rest >> state >> ppid && state != "Z")
      parent_of[std::stoi(name)] = static_cast<pid_t>(ppid);
  }
  return parent_of;
}

}  // namespace

void kill_descendants(pid_t pid) {
  // A few rounds: what a descendant forks while it is being killed is found on the next.
  for (int round = 0; round < 5; ++round) {
    const std::map<pid_t, pid_t> parent_of = parents();
    std::vector<pid_t> found;
    std::set<pid_t> tree{pid};
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& [child, parent] : parent_of) {
        if (tree.count(parent) != 0 && tree.insert(child).second) {
          found.push_back(child);
          grew = true;
        }
      }
    }
    if (found.empty()) return;
    for (pid_t descendant : found) ::kill(descendant, SIGKILL);
  }
}

std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> children;
  for (const auto& [child, parent] : parents()) {
    if (parent == ::getpid()) children.push_back(child);
  }
  return children;
}

}  // namespace sgpu::contract
