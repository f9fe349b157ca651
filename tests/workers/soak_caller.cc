// A soak job's caller through the C++ decorator, as tests/soak/caller.py is through
// Python's: makes the job's calls back to back in one process (one fork server for them
// all), each rank doing what tests/soak/work.py does, and says on stdout, one JSON line
// each, when a call starts and how it ended, with this process's descriptors and zombie
// children after it.
//   sgpu_soak_caller JOB.json
#include <ATen/ATen.h>
#include <dirent.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/process_table.h"
#include "testing/sim_options.h"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Writes `name` in the call's folder whole (a temporary file renamed), as work.py does.
void announce(const fs::path& folder, const std::string& name, const std::string& text) {
  const fs::path temporary = folder / ("." + name + ".tmp");
  std::ofstream(temporary) << text;
  fs::rename(temporary, folder / name);
}

// Every rank: say its pid, join, all-reduce `elements` values `steps` times with a pause
// between, checking every sum; say it is ready after the first.
std::string work(std::string call_dir, int elements, int steps, double pause, std::string blob) {
  const int rank = sgpu::global_rank();
  announce(call_dir, "rank-" + std::to_string(rank) + ".pid", std::to_string(::getpid()));
  c10d::Backend& group = sgpu::process_group();
  const int world = sgpu::world_size();
  const double expected = world * (world + 1) / 2.0;
  for (int step = 0; step < steps; ++step) {
    std::vector<at::Tensor> values{at::full({elements}, rank + 1.0, at::kFloat)};
    group.allreduce(values)->wait();
    if (!values[0].eq(expected).all().item<bool>()) {
      throw std::runtime_error("rank " + std::to_string(rank) + " step " + std::to_string(step) +
                               ": sum " + std::to_string(values[0][0].item<double>()) + ", not " +
                               std::to_string(expected));
    }
    if (step == 0) announce(call_dir, "rank-" + std::to_string(rank) + ".ready", "");
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));
  }
  const auto crc =
      ::crc32(0, reinterpret_cast<const Bytef*>(blob.data()), static_cast<uInt>(blob.size()));
  return json{{"rank", rank}, {"world", world}, {"blob", crc}, {"bytes", blob.size()}}.dump();
}

int warm_up() { return sgpu::global_rank(); }

json descriptors() {
  json found = json::object();
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(dir);
    while (dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] == '.' || std::atoi(entry->d_name) == own) continue;
      std::error_code error;
      const fs::path link = fs::read_symlink(fs::path("/proc/self/fd") / entry->d_name, error);
      if (!error) found[entry->d_name] = link.string();
    }
    ::closedir(dir);
  }
  return found;
}

json zombie_children() {
  json found = json::array();
  for (pid_t pid : sgpu::testing::children_of(::getpid())) {
    const auto stat = sgpu::testing::stat_of(pid);
    if (stat && stat->state == 'Z') found.push_back(pid);
  }
  return found;
}

// The failure's kind as caller.py's outcome spells it.
std::string kind_of(sgpu::RankFailure::Kind kind) {
  switch (kind) {
    case sgpu::RankFailure::Kind::kExitCode:
      return "exit_code";
    case sgpu::RankFailure::Kind::kBadResult:
      return "bad_result";
    case sgpu::RankFailure::Kind::kTimedOut:
      return "timed_out";
    default:
      return sgpu::to_string(kind);
  }
}

template <class Error>
json failed(const std::string& type, const Error& error) {
  json found{
      {"status", "failed"}, {"type", type}, {"message", std::string(error.what()).substr(0, 4000)}};
  if (const sgpu::RankFailure* root = error.root_cause()) {
    found["rank"] = root->rank;
    found["kind"] = kind_of(root->kind);
    found["exit_code"] = root->exit_code ? json(*root->exit_code) : json(nullptr);
    found["signal"] = root->signal ? json(*root->signal) : json(nullptr);
  }
  found["culprits"] = error.collectives().culprits;
  found["run_dir"] = error.run_dir().string();
  return found;
}

void say(json event) { std::cout << event.dump() << std::endl; }

}  // namespace

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  if (argc != 2) {
    std::cerr << "usage: sgpu_soak_caller JOB.json\n";
    return 2;
  }
  const json job = json::parse(std::ifstream(argv[1]));
  const json& calls = job.at("calls");
  // The fork server first, so that every call's descriptors compare with the same start.
  sgpu::Options warm = sgpu::testing::sim(1);
  warm.tracking = false;
  warm.runs_dir = calls.at(0).at("runs_dir").get<std::string>() + "-warm-up";
  sgpu::distributed(warm_up, warm).distributed();
  say({{"event", "ready"}, {"descriptors", descriptors()}});
  for (std::size_t index = 0; index < calls.size(); ++index) {
    const json& call = calls[index];
    sgpu::Options options = sgpu::testing::sim(call.at("world"));
    options.timeout =
        std::chrono::milliseconds(static_cast<long>(call.at("timeout").get<double>() * 1000));
    options.hang_timeout =
        std::chrono::milliseconds(static_cast<long>(call.at("hang_timeout").get<double>() * 1000));
    options.sim.faults = call.at("plan");
    options.runs_dir = call.at("runs_dir").get<std::string>();
    options.name = call.at("name");
    const std::string dir = call.at("dir");
    fs::create_directories(dir);
    say({{"event", "start"}, {"call", index}});
    json found;
    try {
      sgpu::Launch<std::string> handle =
          sgpu::distributed(work, options)
              .launch(dir, call.at("elements").get<int>(), call.at("steps").get<int>(),
                      call.at("pause").get<double>(), std::string(call.at("blob_bytes"), '\x5a'));
      found = {{"status", "ok"}, {"results", json::array()}};
      for (const std::string& result : handle.wait())
        found["results"].push_back(json::parse(result));
      found["run_dir"] = handle.run_dir().string();
    } catch (const sgpu::HangError& error) {
      found = failed("HangError", error);
    } catch (const sgpu::TimeoutError& error) {
      found = failed("TimeoutError", error);
    } catch (const sgpu::DistributedError& error) {
      found = failed("DistributedError", error);
    } catch (const sgpu::Error& error) {
      found = {{"status", "error"}, {"type", "Error"}, {"message", error.what()}, {"run_dir", ""}};
    } catch (const std::exception& error) {
      found = {
          {"status", "error"}, {"type", "exception"}, {"message", error.what()}, {"run_dir", ""}};
    }
    found["event"] = "end";
    found["call"] = index;
    found["descriptors"] = descriptors();
    found["zombies"] = zombie_children();
    say(found);
  }
  return 0;
}
