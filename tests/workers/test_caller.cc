// A caller that its test kills: it launches `ranks` ranks that each leave a grandchild
// behind, print "ready" and hang; the test then signals this process.
//   test_caller <ranks>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "sgpu/sgpu.h"

int hang(int) {
  if (std::system("sleep 300 &") != 0) return -1;
  std::cout << "ready" << std::endl;
  std::this_thread::sleep_for(std::chrono::seconds(300));
  return 0;
}

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  sgpu::Options options;
  options.backend = "sim";
  options.gpus = argc > 1 ? std::atoi(argv[1]) : 2;
  options.teardown_grace = std::chrono::seconds(2);
  try {
    sgpu::distributed(hang, options).distributed(0);
  } catch (const sgpu::Error& e) {
    std::cout << "caller caught: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
