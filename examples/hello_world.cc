// The smallest sgpu program: one function on 8 (simulated) H100s, every rank's result back.
//
//   SGPU_BACKEND=sim build/bin/hello_world
#include <sgpu/sgpu.h>

#include <iostream>
#include <string>

int hello_world(std::string name) {
  if (sgpu::local_rank() == 0) std::cout << "hello " << name << std::endl;
  std::cout << "rank " << sgpu::global_rank() << " of " << sgpu::world_size() << " on "
            << sgpu::device() << std::endl;
  return sgpu::global_rank();
}

int main(int argc, char** argv) {
  sgpu::init(argc, argv);  // in a rank process this runs the rank's function and exits
  try {
    auto hello = sgpu::distributed(hello_world, {.gpus = 8, .gpu_type = "H100"});
    std::vector<int> ranks = hello.distributed("sgpu");
    std::cout << "results:";
    for (int rank : ranks) std::cout << " " << rank;
    std::cout << std::endl;
  } catch (const sgpu::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
