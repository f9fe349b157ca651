// A program whose static initialiser starts a thread: the fork server must refuse to fork
// it, naming the exec start method, and the exec start method must work.
// Exits 0 when both hold.
#include <iostream>
#include <thread>

#include "sgpu/sgpu.h"
#include "testing/sim_options.h"

namespace {
struct StartsAThread {
  StartsAThread() {
    std::thread([] { std::this_thread::sleep_for(std::chrono::hours(1)); }).detach();
  }
} starts_a_thread;

int rank(int) { return sgpu::global_rank(); }
}  // namespace

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  sgpu::Options options = sgpu::testing::sim(2);
  options.start_method = sgpu::StartMethod::kForkServer;
  try {
    sgpu::distributed(rank, options).distributed(0);
    std::cerr << "the fork server forked a threaded process" << std::endl;
    return 1;
  } catch (const sgpu::DistributedError& e) {
    const std::string what = e.what();
    if (what.find("threads") == std::string::npos ||
        what.find("SGPU_START_METHOD=exec") == std::string::npos) {
      std::cerr << "unexpected message: " << what << std::endl;
      return 1;
    }
    std::cout << "refused as expected:\n" << what << std::endl;
  }
  options.start_method = sgpu::StartMethod::kExec;
  if (sgpu::distributed(rank, options).distributed(0) != std::vector<int>{0, 1}) return 1;
  std::cout << "exec start method works" << std::endl;
  return 0;
}
