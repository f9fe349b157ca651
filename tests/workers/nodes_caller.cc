// A C++ program as a team runs it on a cluster, started once per node (by srun, mpirun,
// or by hand with the contract's variables): every node calls the same distributed
// function, whose ranks all-reduce across the nodes. It prints every rank's result, in
// global rank order, one per line:
//   result <i>: rank <r> of <world> on node <n>, sum of ranks <s>
// CRASH_RANK=R makes rank R throw two seconds in; every other rank then sleeps (out of
// any collective), so only sgpu can end it.
//   nodes_caller <gpus per node>
#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/sim_options.h"

std::string report(int round) {
  const char* crash = std::getenv("CRASH_RANK");
  if (crash != nullptr && *crash != '\0') {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    if (std::atoi(crash) == sgpu::global_rank()) {
      throw std::runtime_error("rank " + std::to_string(sgpu::global_rank()) +
                               " crashed on purpose");
    }
    std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  std::vector<at::Tensor> sum{at::full({1}, sgpu::global_rank() + round, at::kLong)};
  sgpu::process_group().allreduce(sum)->wait();
  return "rank " + std::to_string(sgpu::global_rank()) + " of " +
         std::to_string(sgpu::world_size()) + " on node " + std::to_string(sgpu::node_rank()) +
         ", sum of ranks " + std::to_string(sum[0].item<long>());
}

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  sgpu::Options options = sgpu::testing::sim(argc > 1 ? std::atoi(argv[1]) : 2);
  try {
    const std::vector<std::string> results = sgpu::distributed(report, options).distributed(0);
    for (std::size_t i = 0; i < results.size(); ++i) {
      std::cout << "result " << i << ": " << results[i] << "\n";
    }
  } catch (const sgpu::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
  return 0;
}
