#include "collectives/floor.h"

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backend/process_group_factory.h"
#include "sgpu/internal/values.h"

extern char** environ;

namespace sgpu::bench {
namespace {

constexpr const char* kRankVar = "SGPU_BENCH_FLOOR_RANK";
constexpr const char* kWorldVar = "SGPU_BENCH_FLOOR_WORLD";
constexpr const char* kPortVar = "SGPU_BENCH_FLOOR_PORT";
constexpr const char* kBackendVar = "SGPU_BENCH_FLOOR_BACKEND";
constexpr const char* kTimeoutVar = "SGPU_BENCH_FLOOR_TIMEOUT_MS";

std::vector<std::uint8_t> as_bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string as_text(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// A ProcessGroupNCCL made by the CUDA module's entry points (src/backend/cuda/
// process_group.cc): set the device, construct the group; nothing else of sgpu.
c10::intrusive_ptr<c10d::Backend> make_nccl_group(const backend::ProcessGroupRequest& request) {
  const std::string path = SGPU_BENCH_CUDA_MODULE;
  if (path.empty()) throw std::runtime_error("this build has no CUDA backend");
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (module == nullptr) throw std::runtime_error("cannot load " + path + ": " + dlerror());
  auto bind = reinterpret_cast<void (*)(int)>(dlsym(module, "sgpu_cuda_bind"));
  auto make = reinterpret_cast<void (*)(const backend::ProcessGroupRequest*,
                                        c10::intrusive_ptr<c10d::Backend>*)>(
      dlsym(module, "sgpu_cuda_make_process_group"));
  if (bind == nullptr || make == nullptr) throw std::runtime_error(path + " lacks its entries");
  bind(request.device_index);
  c10::intrusive_ptr<c10d::Backend> group;
  make(&request, &group);
  return group;
}

c10::intrusive_ptr<c10d::Backend> make_gloo_group(const backend::ProcessGroupRequest& request) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = request.timeout;
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(request.store, request.rank,
                                                     request.world_size, options);
}

}  // namespace

bool is_floor_rank() { return std::getenv(kRankVar) != nullptr; }

void floor_rank_main() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  const int rank = std::atoi(std::getenv(kRankVar));
  try {
    const std::string backend_name = std::getenv(kBackendVar);
    backend::ProcessGroupRequest request;
    request.rank = rank;
    request.world_size = std::atoi(std::getenv(kWorldVar));
    request.device_index = rank;
    request.timeout = std::chrono::milliseconds(std::atoll(std::getenv(kTimeoutVar)));
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(std::atoi(std::getenv(kPortVar)));
    store_options.isServer = false;
    store_options.timeout = request.timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
    request.store = store;
    const bool cuda = backend_name == "cuda";
    auto group = cuda ? make_nccl_group(request) : make_gloo_group(request);
    const auto spec = serialize::from_bytes<SweepSpec>(as_text(store->get("spec")));
    const SweepResult result =
        run_sweep(*group, spec, cuda ? "cuda:" + std::to_string(rank) : "cpu");
    store->set("result/" + std::to_string(rank), as_bytes(serialize::to_bytes(result)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: floor rank %d failed: %s\n", rank, e.what());
    std::fflush(stderr);
    ::_exit(1);
  }
  std::fflush(stdout);
  ::_exit(0);  // as sgpu's ranks end: no static destructors
}

std::vector<SweepResult> run_floor(const SweepSpec& spec, const std::string& backend,
                                   int world_size, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions store_options;
  store_options.port = 0;
  store_options.isServer = true;
  store_options.waitWorkers = false;
  store_options.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
  store->set("spec", as_bytes(serialize::to_bytes(spec)));

  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::map<pid_t, int> running;  // pid -> rank
  const auto kill_all = [&] {
    for (const auto& [pid, rank] : running) ::kill(pid, SIGKILL);
    for (const auto& [pid, rank] : running) ::waitpid(pid, nullptr, 0);
  };
  for (int rank = 0; rank < world_size; ++rank) {
    std::vector<std::string> env_text;
    for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
    env_text.push_back(std::string(kRankVar) + "=" + std::to_string(rank));
    env_text.push_back(std::string(kWorldVar) + "=" + std::to_string(world_size));
    env_text.push_back(std::string(kPortVar) + "=" + std::to_string(store->getPort()));
    env_text.push_back(std::string(kBackendVar) + "=" + backend);
    env_text.push_back(std::string(kTimeoutVar) + "=" + std::to_string(timeout.count()));
    if (std::getenv("OMP_NUM_THREADS") == nullptr) env_text.emplace_back("OMP_NUM_THREADS=1");
    std::vector<char*> env;
    for (auto& e : env_text) env.push_back(e.data());
    env.push_back(nullptr);
    std::vector<char*> argv{const_cast<char*>(self.c_str()), nullptr};
    pid_t pid = 0;
    if (const int rc = ::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), env.data());
        rc != 0) {
      kill_all();
      throw std::runtime_error("cannot start floor rank " + std::to_string(rank) + ": " +
                               std::strerror(rc));
    }
    running[pid] = rank;
  }

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!running.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0 && running.count(pid) != 0) {
      const int rank = running[pid];
      running.erase(pid);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        kill_all();
        throw std::runtime_error("floor rank " + std::to_string(rank) + " failed (" +
                                 (WIFSIGNALED(status)
                                      ? "signal " + std::to_string(WTERMSIG(status))
                                      : "exit code " + std::to_string(WEXITSTATUS(status))) +
                                 "); its stderr is above");
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::string ranks;
      for (const auto& [p, rank] : running) ranks += " " + std::to_string(rank);
      kill_all();
      throw std::runtime_error("floor ranks still running at the deadline:" + ranks +
                               "; pass a longer --timeout or fewer sizes");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  std::vector<SweepResult> results;
  for (int rank = 0; rank < world_size; ++rank) {
    results.push_back(
        serialize::from_bytes<SweepResult>(as_text(store->get("result/" + std::to_string(rank)))));
  }
  return results;
}

}  // namespace sgpu::bench
