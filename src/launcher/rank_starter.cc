#include "launcher/rank_starter.h"

#include <cstdlib>
#include <map>

#include "sgpu/errors.h"

namespace sgpu::launcher {
namespace {

class ExecStarter final : public RankStarter {
 public:
  pid_t start(const SpawnRequest& request) override {
    const pid_t pid = spawn_process(request);
    running_.emplace(pid, open_exit_fd(pid));
    started_.push_back(pid);
    return pid;
  }

  void add_poll_fds(std::vector<pollfd>& fds) const override {
    for (const auto& [pid, fd] : running_) fds.push_back({fd.get(), POLLIN, 0});
  }

  std::vector<RankExit> collect_exits() override {
    std::vector<RankExit> exits;
    for (auto it = running_.begin(); it != running_.end();) {
      if (auto status = peek_exit(it->first)) {
        exits.push_back({it->first, *status});
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    return exits;
  }

  void release() override {
    for (pid_t pid : started_) reap(pid);
    started_.clear();
    running_.clear();
  }

  ~ExecStarter() override { release(); }

 private:
  std::map<pid_t, UniqueFd> running_;  // pid -> pidfd, until its exit is seen
  std::vector<pid_t> started_;
};

}  // namespace

std::unique_ptr<RankStarter> make_exec_starter() { return std::make_unique<ExecStarter>(); }

StartMethod resolve_start_method(const Options& options) {
  return options.start_method == StartMethod::kExec ? StartMethod::kExec : StartMethod::kForkServer;
}

}  // namespace sgpu::launcher
